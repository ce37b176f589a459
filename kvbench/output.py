"""Shared terminal output: one rich console, JSON printing, number formatting."""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import asdict, is_dataclass
from pathlib import Path

from rich.console import Console

# Piped output (CI logs, files) gets room for wide tables instead of rich's 80-column default.
_WIDTH = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160
console = Console(width=_WIDTH)
err_console = Console(stderr=True)


def jsonable(obj):
    """Plain JSON types; non-finite floats become null (JSON has no NaN)."""
    if is_dataclass(obj) and not isinstance(obj, type):
        return jsonable(asdict(obj))
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, Path):
        return str(obj)
    return obj


def print_json(obj) -> None:
    """Machine-readable output on stdout (nothing else is printed with --json)."""
    sys.stdout.write(json.dumps(jsonable(obj), indent=2) + "\n")


def num(value: float | None, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    return f"{value:,.{digits}f}"
