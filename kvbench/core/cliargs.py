"""Checking what users type: numbers that must be finite and in range, comma lists, choices, KEY=VALUE lists.

Every check fails with a one-line UsageError that names the flag, what was given and the valid form (exit 2
through kvbench.cli.app). Nothing is silently replaced: 0 where a positive number is needed is an error, not
"use the default".
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from kvbench.core.errors import UsageError


def number(
    value: float | int | None,
    flag: str,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    allow_inf: bool = False,
    unit: str = "",
    kind: str = "a finite number",
) -> float | int | None:
    """`value` itself if it is finite (or +inf where allowed) and within [low, high] (low excluded with
    low_open); None passes (the flag was not given)."""
    if value is None:
        return None
    unit = f" {unit}" if unit else ""
    lo = "" if low is None else (f" > {low:g}" if low_open else f" >= {low:g}")
    hi = "" if high is None else f" <= {high:g}"
    valid = f"{kind}{lo}{' and' if lo and hi else ''}{hi}{unit}" + (" (or inf)" if allow_inf else "")
    bad = isinstance(value, float) and (math.isnan(value) or (math.isinf(value) and not (allow_inf and value > 0)))
    if bad or (low is not None and (value <= low if low_open else value < low)) or (high is not None and value > high):
        raise UsageError(f"{flag} must be {valid}, got {value:g}")
    return value


def positive(value, flag: str, unit: str = ""):
    """> 0 and finite."""
    return number(value, flag, low=0, low_open=True, unit=unit)


def at_least_one(value, flag: str, unit: str = ""):
    """A whole number >= 1."""
    return number(value, flag, low=1, unit=unit, kind="a whole number")


def int_list(text: str, flag: str, example: str = "8,16,32") -> list[int]:
    """Comma-separated whole numbers, each >= 1."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{flag} takes comma-separated whole numbers, e.g. {example}; got {text!r}") from None
    if not values or min(values) < 1:
        raise UsageError(f"{flag} needs whole numbers of at least 1, e.g. {example}; got {text!r}")
    return values


def float_list(text: str, flag: str, example: str = "2,4.5", allow_inf: bool = False) -> list[float]:
    """Comma-separated positive finite numbers (+inf too where allowed)."""
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{flag} takes comma-separated numbers, e.g. {example}; got {text!r}") from None
    if not values:
        raise UsageError(f"{flag} is empty; give e.g. {example}")
    for v in values:
        if math.isnan(v) or v <= 0 or (math.isinf(v) and not allow_inf):
            inf = " (or inf)" if allow_inf else ""
            raise UsageError(f"{flag} needs positive finite numbers{inf}, e.g. {example}; got {text!r}")
    return values


def names(text: str, flag: str, example: str) -> list[str]:
    """Comma-separated names, stripped, duplicates dropped, at least one."""
    out = list(dict.fromkeys(v.strip() for v in text.split(",") if v.strip()))
    if not out:
        raise UsageError(f"{flag} is empty; give e.g. {example}")
    return out


def choices(text: str, flag: str, valid: Iterable[str], what: str) -> list[str]:
    """Comma-separated names, each one of `valid` (one line naming the valid ones otherwise), at least one."""
    from kvbench.core.errors import unknown_choice

    valid = list(valid)
    out = names(text, flag, ",".join(valid[:3]))
    for name in out:
        if name not in valid:
            raise unknown_choice(what, name, valid)
    return out


def choice(value: str, flag: str, choices: Iterable[str]) -> str:
    choices = list(choices)
    if value not in choices:
        raise UsageError(f"unknown {flag} {value!r}; choose from: {', '.join(choices)}")
    return value


def key_numbers(text: str, flag: str, keys: Iterable[str], unit: str = "", example: str = "") -> dict[str, float]:
    """`k1=1.5,k2=3` with each key among `keys` and each value positive and finite."""
    keys = list(keys)
    out: dict[str, float] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in keys:
            raise UsageError(
                f"{flag} entry {part.strip()!r} must be KEY=NUMBER with KEY one of: {', '.join(keys)}"
                + (f" (e.g. {example})" if example else "")
            )
        try:
            number_ = float(value)
        except ValueError:
            raise UsageError(
                f"{flag} {key} must be a number{' of ' + unit if unit else ''}, got {value.strip()!r}"
            ) from None
        out[key] = positive(number_, f"{flag} {key}", unit)
    return out
