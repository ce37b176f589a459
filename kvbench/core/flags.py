"""The marker a typed settings model puts on a field to give it a command-line form (kvbench/cli/clisettings.py
builds the typer options from it). Core: every command's settings model and the harness's RunSettings use it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class Flag:
    """A field's command-line form: option names, the type the command line gives when it differs from the
    field's (text the field's validator parses), an environment variable, and the run_defaults.toml key of
    its default ("key": the backend's [cpu]/[gpu] section, "run.key": the [run] table), and the hidden old
    names a renamed flag still answers to."""

    def __init__(
        self,
        *names: str,
        cli: Any = None,
        envvar: str | None = None,
        default_from: str | None = None,
        hidden: tuple[str, ...] = (),
    ):
        self.names, self.cli, self.envvar, self.default_from = names, cli, envvar, default_from
        # old spellings still accepted, left out of --help and the docs (CHANGELOG lists each rename)
        self.hidden = hidden

    def __repr__(self) -> str:
        return f"Flag{self.names}"


class Arg(Flag):
    """A positional argument instead of an option (`kvbench report RECORD`): no names, the field's name."""

    def __init__(self, *, cli: Any = None):
        super().__init__(cli=cli)

    def __repr__(self) -> str:
        return "Arg()"


def flag_of(model: type[BaseModel], name: str) -> Flag | None:
    """The field's Flag; the last one where a field narrows a shared option's (kvbench/specs/options.py) names."""
    flags = [m for m in model.model_fields[name].metadata if isinstance(m, Flag)]
    return flags[-1] if flags else None
