"""Errors that reach the user as one line and a non-zero exit (see kvbench.cli.app.main)."""

from __future__ import annotations

from collections.abc import Iterable


class KvbenchError(Exception):
    """A failure kvbench explains in one line; exit status 1."""

    exit_code = 1


class UsageError(KvbenchError):
    """Bad input from the user (unknown name, malformed file); exit status 2."""

    exit_code = 2


def one_line(exc: BaseException) -> str:
    """An exception as one line: its type and its message with whitespace collapsed."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def unknown_choice(kind: str, value: str, choices: Iterable[str], extra: str = "") -> UsageError:
    """`unknown model 'x'; choose from: a, b, c` — the one-line form every lookup uses."""
    listed = ", ".join(sorted(choices))
    return UsageError(f"unknown {kind} {value!r}; choose from: {listed}{extra}")
