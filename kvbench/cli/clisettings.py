"""A typer command generated from a pydantic settings model, so each setting is declared once (its flag, default,
help and check live on the model's field: kvbench/core/flags.py's Flag, or Arg for a positional argument; the
options many commands share are typed once in kvbench/specs/options.py).

    @command_from(RunSettings, make)
    def command(ctx, settings): ...

gives typer a function `command(ctx, **fields)` whose parameters are the model's Flag fields, in field order;
typer's help, the docs' CLI reference (docs/hooks.py) and the parsing all read that signature. Each call builds
the settings with `make(ctx, values)` (where the command adds what the command line alone knows: the machine,
vLLM's arguments after --) and hands them to the body.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Annotated, Any

import typer
from pydantic import BaseModel
from rich.markup import escape


def options(model: type[BaseModel]) -> list[inspect.Parameter]:
    """One keyword parameter per field with a Flag: Annotated[command-line type, typer.Option(...)] = default
    (typer.Argument(...) for an Arg)."""
    from kvbench.core.flags import Arg, flag_of

    params = []
    for name, field in model.model_fields.items():
        flag = flag_of(model, name)
        if flag is None:
            continue
        # help is plain text, never rich markup: "(default: [fleet] shards)" must not lose "[fleet]" (N-P7)
        text = escape(field.description) if field.description else field.description
        option = (
            typer.Argument(help=text)
            if isinstance(flag, Arg)
            else typer.Option(*flag.names, help=text, envvar=flag.envvar, show_envvar=flag.envvar is not None)
        )
        kind = flag.cli if flag.cli is not None else field.annotation
        default = inspect.Parameter.empty if field.is_required() else field.default  # required: typer asks for it
        params.append(
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[kind, option])
        )
        for old in getattr(flag, "hidden", ()):  # a renamed flag's old name: its own hidden option, same field
            hidden = Annotated[kind | None, typer.Option(old, hidden=True)]
            params.append(
                inspect.Parameter(_alias(name, old), inspect.Parameter.KEYWORD_ONLY, default=None, annotation=hidden)
            )
    return params


def _alias(field: str, old: str) -> str:
    """The parameter name of a field's hidden old flag (`kv_dtype` + `--formats` -> `kv_dtype__formats`)."""
    return f"{field}__{old.lstrip('-').replace('-', '_')}"


def merge_aliases(model: type[BaseModel], ctx: typer.Context, values: dict[str, Any]) -> dict[str, Any]:
    """`values` with each hidden old flag's value moved onto its field; the old and the new name both given is
    one-line usage error."""
    from kvbench.core.errors import UsageError
    from kvbench.core.flags import flag_of

    for name in model.model_fields:
        flag = flag_of(model, name)
        for old in getattr(flag, "hidden", ()):
            value = values.pop(_alias(name, old), None)
            if value is None:
                continue
            if getattr(ctx.get_parameter_source(name), "name", None) == "COMMANDLINE":
                raise UsageError(f"{old} is the old name of {flag.names[0]}: give one of them")
            values[name] = value
    return values


def command_from(
    model: type[BaseModel], make: Callable[[typer.Context, dict[str, Any]], BaseModel]
) -> Callable[[Callable[[typer.Context, Any], Any]], Callable[..., Any]]:
    """The decorator: the body takes (ctx, settings); typer sees (ctx, --every-flag)."""

    def decorate(body: Callable[[typer.Context, Any], Any]) -> Callable[..., Any]:
        @functools.wraps(body)
        def command(ctx: typer.Context, **values: Any) -> Any:
            return body(ctx, make(ctx, merge_aliases(model, ctx, values)))

        params = options(model)
        ctx_param = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)
        command.__signature__ = inspect.Signature([ctx_param, *params])
        # typer reads the types through get_type_hints (the annotations), the options through the signature
        command.__annotations__ = {"ctx": typer.Context, **{p.name: p.annotation for p in params}}
        del command.__wrapped__  # typer must see the generated signature, not the body's
        return command

    return decorate
