"""Tasks kvbench generates itself, so quality can be measured offline. Every item's answer is a string of
digits, checked by exact match:

- passkey: one needle (a 5-digit key, distinct digits) at a known depth in a haystack;
- multikey: RULER-style, four named 5-digit keys, one asked for;
- needle: one long key (NEEDLE_DIGITS digits, repeats allowed) at a known depth: single retrieval, copied exactly;
- manykeys: MANYKEYS_KEYS named keys (`wind70894`), one asked for: multi-key retrieval among look-alikes;
- track: a number updated TRACK_UPDATES times (each update changes TRACK_CHANGE of its digits), the last update
  at a known depth, the earlier ones anywhere before it: variable tracking, where every update in the context
  competes with the last, digit by digit.

passkey and multikey are the first tasks, kept as they were (records name them); the other three are the CPU
default's quality tasks, their difficulty set so the committed tiny model scores between about 70% and 97% at
auto (docs/guide/quality-model.md has the measurements).

Items are deterministic from (task, seed, tokenizer): the haystack is pseudo-English from the tiny model's
own corpus generator, and each prompt is filled to its token budget as measured with the model's
tokenizer. `write_tasks` writes them as lm-eval tasks (one JSONL + one YAML per task, from the template in
kvbench/data/evaltasks/) into a folder keyed by seed and tokenizer fingerprint, for lm-eval's TaskManager
(`include_path`). The same generator feeds the tiny model's training (kvbench.tinymodel.train), with
other seeds than the evaluation items.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib.util
import json
import random
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from kvbench.core.datafiles import cache_root, cached_answer, distribution_key, write_text_atomic
from kvbench.core.errors import UsageError, unknown_choice
from kvbench.realmodels import texttasks
from kvbench.specs import corpus

SEED = 1234  # evaluation items; training draws from other seeds (kvbench.tinymodel.train.TRAIN_SEED_BASE)
PREFIX = "kvbench_"
KINDS = ("passkey", "multikey", "needle", "manykeys", "track")
# Whole context per item = prompt budget + room for the answer: the CPU default serves max_model_len 512.
CONTEXTS = (512, 1024, 2048, 4096)
ANSWER_ROOM = 64  # tokens left for the answer below each context (an answer is 6-8 tokens)
DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)  # needle position as a fraction of the haystack
DEFAULT_ITEMS = 500  # per task: enough paired items to detect a few-point drop (see kvbench.core.stats.detectable_drop)
DEFAULT_TASK = "kvbench_passkey_512"
KEY_DIGITS = 5
MULTIKEY_KEYS = 4  # named keys per multi-key item

PASSKEY_INTRO = "There is a pass key hidden in the text below. Find it and remember it.\n"
PASSKEY_NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key."
PASSKEY_QUESTION = "\nWhat is the pass key? The pass key is"
MULTIKEY_INTRO = "Several pass keys are hidden in the text below, each with a name. Find the one asked for.\n"
MULTIKEY_NEEDLE = "The pass key of {name} is {key}."
MULTIKEY_QUESTION = "\nWhat is the pass key of {name}? The pass key of {name} is"
# The three tasks with headroom. Their knobs (key length, number of keys, number of updates) are what places the
# committed model's auto accuracy in the band; changing one changes every item, so the task's name changes too.
NEEDLE_DIGITS = 14
NEEDLE_INTRO = "A pass key is hidden in the text below. Copy it exactly.\n"
NEEDLE_NEEDLE = "The pass key is {key}."
NEEDLE_QUESTION = "\nWhat is the pass key? The pass key is"
MANYKEYS_KEYS = 8
# Named keys written glued to their name (`wind70894`): the name's last token is the one before the digits, as
# "is" is in a pass-key needle, so copying it takes the one-step match a two-layer model learns (in "... of wind
# is 70894" three tokens stand between name and digits). Names are the corpus words, most of them several tokens:
# two names may end in the same token, and more keys make that likelier.
MANYKEYS_INTRO = "Several keys are hidden in the text below, each right after its name. Find the one asked for.\n"
MANYKEYS_NEEDLE = "Key {name}{key}."
MANYKEYS_QUESTION = "\nWhat is the key of {name}? Key {name}"
TRACK_UPDATES = 4
TRACK_CHANGE = 2  # digits an update changes in the value before it (0: every value drawn afresh)
TRACK_INTRO = "The number in the box changes several times in the text below. Keep track of it.\n"
TRACK_NEEDLE = "The box now holds {key}."
TRACK_QUESTION = "\nWhat number does the box hold at the end? The box now holds"
# Tokens an answer may take: a space, the digits and the stop (lm-eval's max_gen_toks).
MAX_GEN_TOKS = {"passkey": 8, "multikey": 8, "needle": NEEDLE_DIGITS + 3, "manykeys": 7, "track": 8}
# Real models' tasks over natural text (kvbench/realmodels/texttasks.py): their own kinds and contexts.
MAX_GEN_TOKS.update({kind: texttasks.max_gen_tokens(kind) for kind in texttasks.KINDS})
# What comes before the answer's digits in a correct response (the tokenizer writes " 12345" as " " + digits).
ANSWER_PREFIX = {"manykeys": ""}


def continuation(kind: str, answer: str) -> str:
    """The text a correct response starts with: the answer after its kind's prefix."""
    return ANSWER_PREFIX.get(kind, " ") + answer


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


STOP = ("\n", ".")  # generation stops at either (lm-eval's `until`; the task YAML is written with it)


def stop_token_ids(tok) -> set[int]:
    """The token ids a greedy answer ends on: EOS and every token whose text starts with a STOP string."""
    ids = {tok.eos_token_id}
    for token, i in tok.get_vocab().items():
        if tok.convert_tokens_to_string([token])[:1] in STOP:
            ids.add(i)
    return ids


def score(response: str, answer: str) -> int:
    """1 if the response, cut at the first stop string and stripped, is exactly the answer (as lm-eval scores it)."""
    for stop in STOP:
        response = response.split(stop, 1)[0]
    return int(response.strip() == answer)


def task_names() -> list[str]:
    text = [f"{PREFIX}{kind}_{ctx}" for kind in texttasks.KINDS for ctx in texttasks.CONTEXTS]
    return [f"{PREFIX}{kind}_{ctx}" for kind in KINDS for ctx in CONTEXTS] + text


def parse_task(name: str) -> tuple[str, int]:
    """`kvbench_passkey_1024` -> ("passkey", 1024); a one-line UsageError naming the choices otherwise."""
    if name.startswith(PREFIX):
        kind, _, ctx = name[len(PREFIX) :].rpartition("_")
        if kind in KINDS and ctx.isdigit() and int(ctx) in CONTEXTS:
            return kind, int(ctx)
        if kind in texttasks.KINDS and ctx.isdigit() and int(ctx) in texttasks.CONTEXTS:
            return kind, int(ctx)
    raise unknown_choice("kvbench task", name, task_names())


def check_task_names(tasks: list[str]) -> None:
    """Every task known before anything starts: kvbench's by name and context, the others by lm-eval's own
    index (a typo found after a vLLM start costs minutes); one line with the nearest names if not."""
    for task in tasks:
        if task.startswith(PREFIX):
            parse_task(task)
    others = [t for t in tasks if not t.startswith(PREFIX)]
    if not others or importlib.util.find_spec("lm_eval") is None:  # without lm-eval, its evaluation says so
        return
    # lm-eval's index of its ~10,000 task files takes ~5 s to build; the names are kept per lm-eval install
    known = set(cached_answer("lm-eval-tasks", distribution_key("lm_eval", "lm-eval"), _lm_eval_task_names))
    for task in others:
        if task not in known:
            near = difflib.get_close_matches(task, sorted(known), n=3)
            raise UsageError(
                f"unknown lm-eval task {task!r}"
                + (f"; did you mean {', '.join(near)}?" if near else "")
                + f" (lm-eval knows {len(known):,}: `lm-eval ls tasks`; kvbench's own: {', '.join(task_names())})"
            )


def _lm_eval_task_names() -> list[str]:
    from lm_eval.tasks import TaskManager

    return sorted(TaskManager().all_tasks)


def words(seed: int = 0) -> list[str]:
    """The pseudo-words of the tiny model's corpus (names for multi-key needles come from here too)."""
    return corpus.corpus_words(seed)


def sentence(rng: random.Random, vocab: list[str]) -> str:
    return corpus.sentence(rng, vocab)


def sentences(rng: random.Random, n: int) -> list[str]:
    vocab = words()
    return [sentence(rng, vocab) for _ in range(n)]


def key(rng: random.Random) -> str:
    """A pass key: KEY_DIGITS distinct digits, the first not 0. Distinct digits make each digit's successor
    unique, so a model that copies in order (an induction head) can answer; the tiny model has 2 layers."""
    first = rng.choice("123456789")
    return first + "".join(rng.sample([d for d in "0123456789" if d != first], KEY_DIGITS - 1))


def long_key(rng: random.Random, digits: int = NEEDLE_DIGITS) -> str:
    """A needle task's key: `digits` digits, the first not 0, repeats allowed (a digit's successor is not
    unique, so copying it takes more than matching the last digit written)."""
    return rng.choice("123456789") + "".join(rng.choice("0123456789") for _ in range(digits - 1))


@dataclass(frozen=True)
class Parts:
    """An item before its haystack is cut to the budget: the text around the haystack, the needles (each at
    a fraction of the haystack's sentences), the pool of haystack sentences, the answer."""

    intro: str
    needles: list[str]
    positions: list[float]
    question: str
    answer: str
    pool: list[str]
    # Other questions the same haystack answers (the other named keys); training asks them too.
    others: list[tuple[str, str]] = ()

    def build(self, n: int) -> str:
        """The prompt with the first `n` pool sentences as haystack."""
        hay = list(self.pool[:n])
        # Insert from the deepest so earlier insertions do not shift later positions; needles at one place
        # stay in their listed order (the later listed is inserted first).
        order = sorted(range(len(self.needles)), key=lambda i: (-self.positions[i], -i))
        for i in order:
            hay.insert(round(self.positions[i] * n), self.needles[i])
        return self.intro + " ".join(hay) + self.question


def _named_keys(rng: random.Random, n_keys: int, texts: tuple[str, str, str], depth: float, pool: list) -> Parts:
    """`n_keys` named keys (texts: intro, needle, question), one of them asked for (multikey, manykeys)."""
    intro, needle, question = texts
    names = rng.sample(words(), n_keys)
    keys_ = [key(rng) for _ in names]
    needles = [needle.format(name=n, key=k) for n, k in zip(names, keys_, strict=True)]
    # The asked-for needle sits at `depth`; the distractors at random places.
    asked = rng.randrange(n_keys)
    positions = [depth if i == asked else rng.random() for i in range(n_keys)]
    qa = [(question.format(name=n), k) for n, k in zip(names, keys_, strict=True)]
    return Parts(intro, needles, positions, *qa[asked], pool, qa[:asked] + qa[asked + 1 :])


def parts(
    kind: str,
    budget: int,
    depth: float,
    rng: random.Random,
    *,
    digits: int | None = None,
    keys: int | None = None,
    updates: int | None = None,
    change: int | None = None,
) -> Parts:
    """What an item of `kind` holds, drawn from `rng` (the haystack pool sized for `budget` tokens). The
    keyword knobs (a needle's digits, a manykeys item's keys, a track item's updates) default to the task's
    own; the trainer varies them."""
    # Sentences are ~12 tokens; draw enough for the budget with margin, then keep as many as fit.
    pool = sentences(rng, budget // 6 + 4)
    if kind == "passkey":
        key_ = key(rng)
        return Parts(PASSKEY_INTRO, [PASSKEY_NEEDLE.format(key=key_)], [depth], PASSKEY_QUESTION, key_, pool)
    if kind == "needle":
        key_ = long_key(rng, digits or NEEDLE_DIGITS)
        return Parts(NEEDLE_INTRO, [NEEDLE_NEEDLE.format(key=key_)], [depth], NEEDLE_QUESTION, key_, pool)
    if kind == "multikey":
        return _named_keys(rng, MULTIKEY_KEYS, (MULTIKEY_INTRO, MULTIKEY_NEEDLE, MULTIKEY_QUESTION), depth, pool)
    if kind == "manykeys":
        texts = (MANYKEYS_INTRO, MANYKEYS_NEEDLE, MANYKEYS_QUESTION)
        return _named_keys(rng, keys or MANYKEYS_KEYS, texts, depth, pool)
    if kind == "track":
        n = updates or TRACK_UPDATES
        change = TRACK_CHANGE if change is None else change
        values: list[str] = []
        while len(values) < n:
            v = key(rng) if not values or not change else _changed(values[-1], change, rng)
            if v not in values:
                values.append(v)
        # The last update at `depth` (0: the start of the text, far from the question), the others before it.
        positions = sorted(depth * rng.random() for _ in range(n - 1)) + [depth]
        needles = [TRACK_NEEDLE.format(key=v) for v in values]
        return Parts(TRACK_INTRO, needles, positions, TRACK_QUESTION, values[-1], pool)
    raise unknown_choice("kvbench task kind", kind, list(KINDS))


def _changed(value: str, n: int, rng: random.Random) -> str:
    """`value` with `n` of its digits replaced by other digits (the first never by 0)."""
    digits = list(value)
    for i in rng.sample(range(len(digits)), n):
        digits[i] = rng.choice([d for d in "0123456789" if d != digits[i] and (i or d != "0")])
    return "".join(digits)


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
    p = parts(kind, budget, depth, rng)
    text, n_tokens = _fit(tok, p.build, len(p.pool), budget)
    return Item(doc_id, text, p.answer, depth, n_tokens, context or budget + ANSWER_ROOM)


def generate(task: str, tok: Tokenizer, n: int = DEFAULT_ITEMS, seed: int = SEED) -> list[Item]:
    """The task's items, deterministic from (task, seed, tokenizer); depths cycle through DEPTHS."""
    kind, ctx = parse_task(task)
    if kind in texttasks.KINDS:  # natural-text haystacks, items grouped by shared haystack
        return [
            Item(i, d["prompt"], d["answer"], d["depth"], d["prompt_tokens"], d["context"])
            for i, d in enumerate(texttasks.generate(kind, ctx, tok, n, seed, ANSWER_ROOM))
        ]
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
    name = f"seed{seed}-n{n}-tok{tokenizer_fingerprint(tokenizer_dir)}-def{definition_fingerprint()}"
    return (root or cache_root()) / "evaltasks" / name


def wording() -> list:
    """The tasks' fixed text: what a model trained on them learns (its training hashes it into its fingerprint)."""
    return [
        [PASSKEY_INTRO, PASSKEY_NEEDLE, PASSKEY_QUESTION, MULTIKEY_INTRO, MULTIKEY_NEEDLE, MULTIKEY_QUESTION],
        [NEEDLE_INTRO, NEEDLE_NEEDLE, NEEDLE_QUESTION, MANYKEYS_INTRO, MANYKEYS_NEEDLE, MANYKEYS_QUESTION],
        [TRACK_INTRO, TRACK_NEEDLE, TRACK_QUESTION, ANSWER_PREFIX],
    ]


def definition_fingerprint() -> str:
    """Hash of what shapes the items besides seed and tokenizer (wordings, knobs, the answer-length table):
    task files written under another definition are not reused."""
    knobs = [KEY_DIGITS, MULTIKEY_KEYS, NEEDLE_DIGITS, MANYKEYS_KEYS, TRACK_UPDATES, TRACK_CHANGE, ANSWER_ROOM]
    knobs.append(list(DEPTHS))
    blob = json.dumps([wording(), knobs, MAX_GEN_TOKS, template(), texttasks.definition()])
    return hashlib.sha256(blob.encode()).hexdigest()[:8]


def write_tasks(
    tokenizer_dir: str | Path, tasks: list[str], seed: int = SEED, n: int = DEFAULT_ITEMS, root: Path | None = None
) -> Path:
    """Write each task's JSONL + YAML (once; later calls reuse them) and return the folder for include_path."""
    for task in tasks:
        parse_task(task)
    folder = tasks_dir(tokenizer_dir, seed, n, root)
    missing = [t for t in tasks if not (folder / f"{t}.yaml").exists()]
    if not missing:
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    from kvbench.core.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer_dir)
    for task in missing:
        items = generate(task, tok, n, seed)
        data = "".join(json.dumps(item.doc(), sort_keys=True) + "\n" for item in items)
        write_text_atomic(folder / f"{task}.jsonl", data)
        # The YAML last: its presence means the task is complete.
        yaml = string.Template(template()).substitute(
            task=task,
            data=json.dumps(str(folder / f"{task}.jsonl")),
            until=json.dumps(list(STOP)),
            max_gen_toks=MAX_GEN_TOKS[parse_task(task)[0]],
        )
        write_text_atomic(folder / f"{task}.yaml", yaml)
    return folder
