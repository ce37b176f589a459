"""The options many commands share, declared once: each one's flag, type, default, check and help, as an
Annotated type a settings model gives its field (kvbench/cli/clisettings.py turns the fields into typer options).

    as_json: AsJson = Field(description="Print the rows as JSON.")

keeps the flag, type and default and says what this command prints; a field that says nothing more takes the
shared help. A field that holds the parsed value rather than the text (RunSettings' --endpoint: a {dtype: URL}
map) takes `parsed(its type, the shared option)`. Core: the commands' settings models and the harness's
RunSettings use it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import AfterValidator, Field

from kvbench.core import cliargs
from kvbench.core.flags import Flag

if TYPE_CHECKING:
    import typer


def _machine(name: str | None) -> str | None:
    """A folder under --results, never a path out of it (kvbench.specs.machine's rule, one line and exit 2)."""
    from kvbench.specs.machine import check_machine_name

    return check_machine_name(name) if name else name


def _percent(value: float | None) -> float | None:
    return cliargs.number(value, "--threshold", low=0, unit="%")


def _seconds(value: float | None) -> float | None:
    return cliargs.positive(value, "--startup-timeout", unit="s")


Model = Annotated[
    str | None, Flag("--model", "-m"), Field(None, description="HF id, short name or local path of the model.")
]
Results = Annotated[Path, Flag("--results"), Field(Path("results"), description="Results folder.")]
AsJson = Annotated[bool, Flag("--json"), Field(False, description="Print JSON instead of tables.")]
Machine = Annotated[
    str | None,
    Flag("--machine"),
    AfterValidator(_machine),
    Field(None, description="Machine name: the folder under --results (default: named from the GPU or CPU)."),
]


def default_kv_dtypes() -> str:
    """The dtypes a run measures when --kv-dtypes is not given, as run_defaults.toml sets them per backend."""
    from kvbench.core.datafiles import load_toml

    table = load_toml("run_defaults.toml")
    cpu, gpu = (",".join(table[key]["kv_dtypes"]) for key in ("cpu", "gpu"))
    return cpu if cpu == gpu else f"CPU {cpu}, GPU {gpu}"


KvDtypes = Annotated[
    str | None,
    Flag("--kv-dtypes", cli=str | None),
    Field(None, description=f"Comma-separated --kv-cache-dtype values (default {default_kv_dtypes()})."),
]
Endpoint = Annotated[
    str | None,
    Flag("--endpoint", cli=str | None),
    Field(None, description="Running servers: URL (one server, its dtype read from /metrics) or auto=URL1,fp8=URL2"),
]
ApiKey = Annotated[
    str | None,
    Flag("--api-key", envvar="OPENAI_API_KEY"),
    Field(None, description="Bearer key for --endpoint servers (never recorded)."),
]
Header = Annotated[
    list[str] | None,
    Flag("--header", cli=list[str] | None),
    Field(None, description="Extra header for --endpoint servers, 'NAME: VALUE' (repeatable; never recorded)."),
]


def endpoint_key(ctx: typer.Context, api_key: str | None, endpoint) -> str | None:
    """--api-key for a command given its --endpoint: OPENAI_API_KEY in the shell is
    for --endpoint servers and ignored (with a note) by a run or eval that starts its own servers; the key
    itself is checked with the other settings (harness/server/endpoint.py request_headers)."""
    from kvbench.core.output import err_console

    source = ctx.get_parameter_source("api_key")  # click's ParameterSource (typer may vendor its own click)
    if api_key is not None and endpoint is None and getattr(source, "name", None) == "ENVIRONMENT":
        err_console.print("[dim]OPENAI_API_KEY is set and not used: kvbench's own servers need no key[/]")
        return None
    return api_key


# --asv-config everywhere (nightly's --config is its own nightly.toml); --config is the old, hidden name here
AsvConfig = Annotated[
    Path, Flag("--asv-config", hidden=("--config",)), Field(Path("asv.conf.json"), description="asv config.")
]
Threshold = Annotated[
    float | None,
    Flag("--threshold"),
    AfterValidator(_percent),
    Field(None, description="Changes within this % count as noise (default: each metric's noise floor)."),
]
StartupTimeout = Annotated[
    float | None,
    Flag("--startup-timeout"),
    AfterValidator(_seconds),
    Field(None, description="Seconds to wait for each server to become ready."),
]


def parsed(kind: Any, shared: Any, default_from: str | None = None) -> Any:
    """`shared`'s flag, default and help on a field that holds `kind`, which the model's own validator parses
    from the command line's text (the Flag's cli type); `default_from` names its run_defaults.toml key."""
    meta = [
        Flag(*m.names, cli=m.cli, envvar=m.envvar, default_from=default_from or m.default_from)
        if isinstance(m, Flag)
        else m
        for m in shared.__metadata__
    ]
    return Annotated[(kind, *meta)]
