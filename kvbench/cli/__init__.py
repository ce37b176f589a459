"""The `kvbench` command line: the typer app (app.py), its settings plumbing (clisettings.py) and one module per
command (commands/). `kvbench.cli:main` is the console entry point (pyproject's [project.scripts])."""

from __future__ import annotations


def main(argv: list[str] | None = None) -> None:
    """The console entry point; the app is built on first call, so importing one command module stays light."""
    from kvbench.cli.app import main as run

    run(argv)
