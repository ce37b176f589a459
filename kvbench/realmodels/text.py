"""Natural English that ships with every CPython: `pydoc_data.topics` (the documentation behind `help()`, about
65,000 words). Real models are scored on it (fidelity per token) and retrieve keys hidden in it (tasks): nothing
is downloaded, and every machine with the same Python reads the same text.
"""

from __future__ import annotations

import functools
import hashlib


@functools.cache
def topics() -> tuple[tuple[str, str], ...]:
    """(topic, text) in name order: the order every reader here uses."""
    from pydoc_data.topics import topics as table

    return tuple(sorted(table.items()))


def corpus() -> str:
    """All topics, one after another, separated by blank lines."""
    return "\n\n".join(text.strip() for _, text in topics())


@functools.cache
def lines() -> tuple[str, ...]:
    """The corpus' non-empty lines (a haystack is cut from whole lines; a needle goes between two)."""
    return tuple(line.rstrip() for line in corpus().splitlines() if line.strip())


def fingerprint() -> str:
    """Of the text itself: a Python whose pydoc_data differs gives other items, under another cache key."""
    return hashlib.sha256(corpus().encode()).hexdigest()[:12]


def windows(token_ids: list[int], length: int, count: int) -> list[list[int]]:
    """`count` windows of `length` tokens, spread evenly over the corpus' tokens (never overlapping while the
    corpus holds them; ValueError when it does not)."""
    if count * length > len(token_ids):
        raise ValueError(f"the corpus has {len(token_ids):,} tokens, fewer than {count} x {length}")
    stride = len(token_ids) // count
    return [token_ids[i * stride : i * stride + length] for i in range(count)]
