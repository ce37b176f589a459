"""Byte units. kvbench says GB (10^9 bytes) or GiB (2^30 bytes) explicitly, never "G"."""

from __future__ import annotations

GB = 10**9
GiB = 2**30
MiB = 2**20
KiB = 2**10


def fmt_gb(n_bytes: float, digits: int = 2) -> str:
    return f"{n_bytes / GB:.{digits}f} GB"


def fmt_gib(n_bytes: float, digits: int = 2) -> str:
    return f"{n_bytes / GiB:.{digits}f} GiB"


def fmt_both(n_bytes: float, digits: int = 2) -> str:
    """'55.94 GB (52.10 GiB)' — for budgets, where the two are easily confused."""
    return f"{fmt_gb(n_bytes, digits)} ({fmt_gib(n_bytes, digits)})"


def fmt_kib(n_bytes: float, digits: int = 1) -> str:
    return f"{n_bytes / KiB:,.{digits}f} KiB"
