"""Retrieval tasks kvbench generates itself, so quality can be measured offline: passkey retrieval (one
needle at a known depth in a haystack) and multi-key retrieval (RULER-style: several named keys, one asked
for). Every item's answer is a string of digits, checked by exact match.

Items are deterministic from (task, seed, tokenizer): the haystack is pseudo-English from the tiny model's
own corpus generator, and each prompt is filled to its token budget as measured with the model's
tokenizer. `write_tasks` writes them as lm-eval tasks (one JSONL + one YAML per task, from the template in
kvbench/data/evaltasks/) into a folder keyed by seed and tokenizer fingerprint, for lm-eval's TaskManager
(`include_path`). The same generator feeds the tiny model's training (kvbench.harness.tinytrain), with
other seeds than the evaluation items.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import random
import string
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from kvbench.errors import UsageError, unknown_choice

SEED = 1234  # evaluation items; training draws from other seeds (tinytrain.TRAIN_SEED)
PREFIX = "kvbench_"
KINDS = ("passkey", "multikey")
# Whole context per item = prompt budget + room for the answer: the CPU default serves max_model_len 512.
CONTEXTS = (512, 1024, 2048, 4096)
ANSWER_ROOM = 64  # tokens left for the answer below each context (an answer is 6-8 tokens)
DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)  # needle position as a fraction of the haystack
DEFAULT_ITEMS = 500  # per task: enough paired items to detect a few-point drop (see kvbench.stats.detectable_drop)
DEFAULT_TASK = "kvbench_passkey_512"
KEY_DIGITS = 5
MULTIKEY_KEYS = 4  # named keys per multi-key item

PASSKEY_INTRO = "There is a pass key hidden in the text below. Find it and remember it.\n"
PASSKEY_NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key."
PASSKEY_QUESTION = "\nWhat is the pass key? The pass key is"
MULTIKEY_INTRO = "Several pass keys are hidden in the text below, each with a name. Find the one asked for.\n"
MULTIKEY_NEEDLE = "The pass key of {name} is {key}."
MULTIKEY_QUESTION = "\nWhat is the pass key of {name}? The pass key of {name} is"


class Tokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


@dataclass(frozen=True)
class Item:
    doc_id: int
    prompt: str
    answer: str  # the digits the model must produce (no leading space)
    depth: float  # of the asked-for needle, 0 = start of the haystack, 1 = end
    prompt_tokens: int
    context: int

    def doc(self) -> dict:
        return {
            "doc_id": self.doc_id,
            "prompt": self.prompt,
            "answer": self.answer,
            "depth": self.depth,
            "prompt_tokens": self.prompt_tokens,
            "context": self.context,
        }


STOP = ("\n", ".")  # generation stops at either (lm-eval's `until`)
MAX_GEN_TOKS = 8  # room for the answer (lm-eval's `max_gen_toks`); the task YAML is written with both


def score(response: str, answer: str) -> int:
    """1 if the response, cut at the first stop string and stripped, is exactly the answer (as lm-eval scores it)."""
    for stop in STOP:
        response = response.split(stop, 1)[0]
    return int(response.strip() == answer)


def task_names() -> list[str]:
    return [f"{PREFIX}{kind}_{ctx}" for kind in KINDS for ctx in CONTEXTS]


def parse_task(name: str) -> tuple[str, int]:
    """`kvbench_passkey_1024` -> ("passkey", 1024); a one-line UsageError naming the choices otherwise."""
    if name.startswith(PREFIX):
        kind, _, ctx = name[len(PREFIX) :].rpartition("_")
        if kind in KINDS and ctx.isdigit() and int(ctx) in CONTEXTS:
            return kind, int(ctx)
    raise unknown_choice("kvbench task", name, task_names())


def check_task_names(tasks: list[str]) -> None:
    """Every task known before anything starts: kvbench's by name and context, the others by lm-eval's own
    index (a typo found after a vLLM start costs minutes); one line with the nearest names if not."""
    for task in tasks:
        if task.startswith(PREFIX):
            parse_task(task)
    others = [t for t in tasks if not t.startswith(PREFIX)]
    if not others:
        return
    try:
        from lm_eval.tasks import TaskManager
    except ImportError:  # lm-eval itself says so when the evaluation starts
        return
    known = set(TaskManager().all_tasks)
    for task in others:
        if task not in known:
            near = difflib.get_close_matches(task, sorted(known), n=3)
            raise UsageError(
                f"unknown lm-eval task {task!r}"
                + (f"; did you mean {', '.join(near)}?" if near else "")
                + f" (lm-eval knows {len(known):,}: `lm-eval ls tasks`; kvbench's own: {', '.join(task_names())})"
            )


def words(seed: int = 0) -> list[str]:
    """The pseudo-words of the tiny model's corpus (names for multi-key needles come from here too)."""
    from kvbench.harness.tinymodel import corpus_words

    return corpus_words(seed)


def sentences(rng: random.Random, n: int) -> list[str]:
    from kvbench.harness.tinymodel import sentence

    vocab = words()
    return [sentence(rng, vocab) for _ in range(n)]


def key(rng: random.Random) -> str:
    """A pass key: KEY_DIGITS distinct digits, the first not 0. Distinct digits make each digit's successor
    unique, so a model that copies in order (an induction head) can answer; the tiny model has 2 layers."""
    first = rng.choice("123456789")
    return first + "".join(rng.sample([d for d in "0123456789" if d != first], KEY_DIGITS - 1))


def _fit(tok: Tokenizer, build, n_max: int, budget: int) -> tuple[str, int]:
    """The longest prompt `build(n)` (n haystack sentences) within `budget` tokens, by bisection."""

    def length(n: int) -> int:
        return len(tok.encode(build(n), add_special_tokens=False))

    lo, hi = 0, n_max
    if length(0) > budget:
        raise ValueError(f"a prompt without haystack exceeds {budget} tokens")
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if length(mid) <= budget:
            lo = mid
        else:
            hi = mid - 1
    text = build(lo)
    return text, length(lo)


def make_item(
    kind: str,
    budget: int,
    depth: float,
    rng: random.Random,
    tok: Tokenizer,
    doc_id: int = 0,
    context: int | None = None,
) -> Item:
    """One item whose prompt fills `budget` tokens (as close as whole sentences allow)."""
    # Sentences are ~12 tokens; draw enough for the budget with margin, then keep as many as fit.
    pool = sentences(rng, budget // 6 + 4)
    if kind == "passkey":
        key_ = key(rng)
        needles = [PASSKEY_NEEDLE.format(key=key_)]
        intro, question, answer = PASSKEY_INTRO, PASSKEY_QUESTION, key_
        positions = [depth]
    else:
        names = rng.sample(words(), MULTIKEY_KEYS)
        keys = [key(rng) for _ in names]
        needles = [MULTIKEY_NEEDLE.format(name=n, key=k) for n, k in zip(names, keys, strict=True)]
        # The asked-for needle sits at `depth`; the distractors at random places.
        asked = rng.randrange(MULTIKEY_KEYS)
        positions = [depth if i == asked else rng.random() for i in range(MULTIKEY_KEYS)]
        intro, question, answer = MULTIKEY_INTRO, MULTIKEY_QUESTION.format(name=names[asked]), keys[asked]

    def build(n: int) -> str:
        hay = list(pool[:n])
        # Insert from the deepest so earlier insertions do not shift later positions.
        for pos, needle in sorted(zip(positions, needles, strict=True), key=lambda p: -p[0]):
            hay.insert(round(pos * n), needle)
        return intro + " ".join(hay) + question

    text, n_tokens = _fit(tok, build, len(pool), budget)
    return Item(doc_id, text, answer, depth, n_tokens, context or budget + ANSWER_ROOM)


def generate(task: str, tok: Tokenizer, n: int = DEFAULT_ITEMS, seed: int = SEED) -> list[Item]:
    """The task's items, deterministic from (task, seed, tokenizer); depths cycle through DEPTHS."""
    kind, ctx = parse_task(task)
    rng = random.Random(f"{task}/{seed}")
    return [
        make_item(kind, ctx - ANSWER_ROOM, DEPTHS[i % len(DEPTHS)], rng, tok, doc_id=i, context=ctx) for i in range(n)
    ]


# -- lm-eval task files ----------------------------------------------------------------------------------


def tokenizer_fingerprint(tokenizer_dir: str | Path) -> str:
    """Hash of the tokenizer's files (items' token budgets depend on it); of its name for a hub id."""
    h = hashlib.sha256()
    files = [Path(tokenizer_dir) / name for name in ("tokenizer.json", "tokenizer_config.json")]
    if not any(f.exists() for f in files):
        h.update(b"name\0" + str(tokenizer_dir).encode())
    for path in files:
        if path.exists():
            h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:12]


def template() -> str:
    from importlib.resources import files

    return files("kvbench").joinpath("data/evaltasks/retrieval.yaml").read_text()


def tasks_dir(tokenizer_dir: str | Path, seed: int = SEED, n: int = DEFAULT_ITEMS, root: Path | None = None) -> Path:
    from kvbench.harness.tinymodel import cache_root

    return (root or cache_root()) / "evaltasks" / f"seed{seed}-n{n}-tok{tokenizer_fingerprint(tokenizer_dir)}"


def write_tasks(
    tokenizer_dir: str | Path, tasks: list[str], seed: int = SEED, n: int = DEFAULT_ITEMS, root: Path | None = None
) -> Path:
    """Write each task's JSONL + YAML (once; later calls reuse them) and return the folder for include_path."""
    from transformers import AutoTokenizer

    for task in tasks:
        parse_task(task)
    folder = tasks_dir(tokenizer_dir, seed, n, root)
    missing = [t for t in tasks if not (folder / f"{t}.yaml").exists()]
    if not missing:
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    for task in missing:
        items = generate(task, tok, n, seed)
        data = "".join(json.dumps(item.doc(), sort_keys=True) + "\n" for item in items)
        _write_atomic(folder / f"{task}.jsonl", data)
        # The YAML last: its presence means the task is complete.
        yaml = string.Template(template()).substitute(
            task=task,
            data=json.dumps(str(folder / f"{task}.jsonl")),
            until=json.dumps(list(STOP)),
            max_gen_toks=MAX_GEN_TOKS,
        )
        _write_atomic(folder / f"{task}.yaml", yaml)
    return folder


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
