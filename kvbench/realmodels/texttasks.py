"""Retrieval tasks over natural text, for real models: named access codes hidden in CPython's documentation
(kvbench.realmodels.text), one asked per item: among a few keys (`textkey`, 4 per haystack) or among many
(`textkeys`, 16: RULER's multi-key retrieval, where the distractors look alike).

Items come in groups that share one haystack: a stretch of the documentation of the group's context length with
the kind's named codes spread through it, each asked once. Every item of a group starts with the same text, so a
server with prefix caching prefills each haystack once and then answers each question from the cached, quantised
K/V: the read path a KV dtype changes, at a cost of a few tokens per item. (A model of 135M parameters answers
two codes in one response at 0-1% at bf16, measured: no signal, so each item asks one.) Contexts cycle over
the task's contexts up to the one in its name (1K to 8K for SmolLM2; 1K and 2K for Gemma, past its 512-token
sliding window). Wording and knobs are in kvbench/data/texttasks.toml; answers are exact digit strings.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable

from kvbench.core.datafiles import load_toml
from kvbench.realmodels import text

SPEC = load_toml("texttasks.toml")
KINDS = ("textkey", "textkeys")
CONTEXTS = tuple(SPEC["contexts"])


def group_contexts(max_context: int) -> list[int]:
    """The haystack contexts a task of `max_context` cycles through: every listed context up to it."""
    return [c for c in CONTEXTS if c <= max_context]


def _code(rng: random.Random) -> str:
    digits = SPEC["code_digits"]
    return rng.choice("123456789") + "".join(rng.choice("0123456789") for _ in range(digits - 1))


def _haystack(kind: str, context: int, group: int, seed: int):
    """A group's names, codes, needle positions (fractions of its lines) and its line pool."""
    rng = random.Random(f"texthay/{kind}/{context}/{group}/{seed}")
    lines = text.lines()
    start = rng.randrange(len(lines))
    pool = [lines[(start + i) % len(lines)] for i in range(context // 4 + 8)]  # a line is >= ~4 tokens
    names = rng.sample(SPEC["names"]["names"], SPEC[kind]["keys"])
    codes = []
    while len(codes) < len(names):
        c = _code(rng)
        if c not in codes:
            codes.append(c)
    # spread evenly (one per slice of the haystack, random inside it): every depth is asked
    slots = sorted((i + rng.random()) / len(names) for i in range(len(names)))
    return names, codes, slots, pool


def _prompt(names, codes, slots, pool, n: int, question: str) -> str:
    hay = list(pool[:n])
    for i in sorted(range(len(names)), key=lambda i: -slots[i]):
        hay.insert(round(slots[i] * n), SPEC["wording"]["needle"].format(name=names[i], code=codes[i]))
    return SPEC["wording"]["intro"] + "\n".join(hay) + question


def generate(kind: str, max_context: int, tok, n: int, seed: int, answer_room: int) -> list[dict]:
    """`n` items of `kind`: {prompt, answer, depth, prompt_tokens, context, group}. The haystack fills the group's
    context less `answer_room` and the question (whole lines, by bisection with the model's tokenizer)."""
    keys = SPEC[kind]["keys"]
    contexts = group_contexts(max_context)
    out, fitted = [], {}
    for i in range(n):
        group, index = divmod(i, keys)
        context = contexts[group % len(contexts)]
        names, codes, slots, pool = _haystack(kind, context, group, seed)
        question = SPEC["wording"]["question"].format(name=names[index])
        if (context, group) not in fitted:  # the same line count for every item of the group: one prefix
            room = context - answer_room - SPEC["question_room"]
            parts = (names, codes, slots, pool)
            fitted[(context, group)] = _fit(tok, lambda k, p=parts: _prompt(*p, k, ""), len(pool), room)
        prompt = _prompt(names, codes, slots, pool, fitted[(context, group)], question)
        out.append(
            {
                "prompt": prompt,
                "answer": codes[index],
                "depth": slots[index],
                "prompt_tokens": len(tok.encode(prompt, add_special_tokens=False)),
                "context": context,
                "group": group,
            }
        )
    return out


def _fit(tok, build: Callable[[int], str], n_max: int, budget: int) -> int:
    lo, hi = 0, n_max
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(tok.encode(build(mid), add_special_tokens=False)) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


def max_gen_tokens(kind: str) -> int:
    """Room for an answer: a space, the digits (a tokenizer may split them in ones), the stop."""
    return SPEC["code_digits"] + 3


def definition() -> str:
    """What shapes the items besides seed and tokenizer: the spec and the text itself."""
    return hashlib.sha256(json.dumps([SPEC, text.fingerprint()], sort_keys=True).encode()).hexdigest()[:8]
