"""The marker a typed settings model puts on a field to give it a command-line form (kvbench/clisettings.py
builds the typer options from it). Core: every command's settings model and the harness's RunSettings use it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class Flag:
    """A field's command-line form: option names, the type the command line gives when it differs from the
    field's (text the field's validator parses), an environment variable, and the run_defaults.toml key of
    its default ("key": the backend's [cpu]/[gpu] section, "run.key": the [run] table)."""

    def __init__(self, *names: str, cli: Any = None, envvar: str | None = None, default_from: str | None = None):
        self.names, self.cli, self.envvar, self.default_from = names, cli, envvar, default_from

    def __repr__(self) -> str:
        return f"Flag{self.names}"


def flag_of(model: type[BaseModel], name: str) -> Flag | None:
    return next((m for m in model.model_fields[name].metadata if isinstance(m, Flag)), None)
