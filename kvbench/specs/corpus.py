"""The generated pseudo-English text that both kvbench's own evaluation tasks (kvbench.specs.evaltasks: haystacks,
needle names) and the tiny model's tokenizer corpus (kvbench.tinymodel.build) are made of. It lives below both,
so that neither imports the other for it.
"""

from __future__ import annotations

import functools
import random

from kvbench.core.datafiles import load_toml

SEED = load_toml("tinymodel.toml")["model"]["init_seed"]  # the tiny model's corpus seed (its default)

ONSETS = ["b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "st", "tr", "ch", "sh"]
VOWELS = ["a", "e", "i", "o", "u", "ai", "ea", "ou"]
CODAS = ["", "n", "r", "s", "t", "l", "nd", "st"]
COMMON = ["the", "a", "of", "and", "to", "in", "is", "that", "for", "on", "with", "as", "cache", "token", "model"]


@functools.cache
def corpus_words(seed: int = SEED) -> list[str]:
    """The generated pseudo-English vocabulary (sorted, deterministic from `seed`)."""
    rng = random.Random(seed)
    return sorted(
        {"".join(rng.choice(x) for x in (ONSETS, VOWELS, CODAS)) * rng.choice([1, 1, 2]) for _ in range(3000)}
    )


def sentence(rng: random.Random, vocab: list[str]) -> str:
    n = rng.randint(5, 16)
    words = [rng.choice(COMMON) if rng.random() < 0.3 else rng.choice(vocab) for _ in range(n)]
    return " ".join(words).capitalize() + rng.choice([".", ".", ".", "?", "!"])
