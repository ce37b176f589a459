"""Progress on the terminal for long runs: one line per dtype phase, with a bar for request counts.

Everything here goes to stderr, so a command's stdout holds only its result (a table, or one JSON document
with --json) and can be piped.
"""

from __future__ import annotations

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kvbench.core.output import err_console
from kvbench.harness.run.runplan import Reporter


def new_progress(disable: bool = False) -> Progress:
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    return Progress(*columns, console=err_console, transient=False, disable=disable)


class ProgressReporter(Reporter):
    """Draws the runner's progress (kvbench.harness.run.runplan.Reporter) on a rich Progress."""

    def __init__(self, progress: Progress):
        self.progress = progress
        self.task = None
        self.dtype = ""

    def dtype_started(self, dtype: str, index: int, total: int) -> None:
        self.dtype = dtype
        self.progress.console.print(f"[bold]KV dtype {dtype}[/] ({index + 1}/{total})")

    def phase(self, dtype: str, text: str, total: int | None = None) -> None:
        if self.task is not None:
            self.progress.update(self.task, visible=False)
        if not self.progress.console.is_terminal:  # a log (CI, a pipe) gets no live bars: one line per phase
            self.progress.console.print(f"{dtype}: {text}", highlight=False)
        self.task = self.progress.add_task(f"{dtype}: {text}", total=total)

    def advance(self, done: int, total: int) -> None:
        if self.task is not None:
            self.progress.update(self.task, completed=done, total=total)

    def note(self, text: str) -> None:
        self.progress.console.print(text)
