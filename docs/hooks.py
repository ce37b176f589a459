"""mkdocs hook: the pages that must never drift from the code are generated from it at build time.

A page holds a marker line; the build replaces it with markdown:
    <!-- generated: cli-reference -->    every `kvbench` command, from the typer app in kvbench/cli/app.py
    <!-- generated: record-schema -->    the run record's types, from the pydantic models in kvbench/records/schema.py
An unknown marker fails the build (a typo would otherwise publish an empty section).
"""

from __future__ import annotations

import inspect
import io
import re
import sys
import tokenize
import types
import typing
from enum import Enum

MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.MULTILINE)


def on_page_markdown(markdown: str, page, config, files) -> str:
    def generate(match: re.Match) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise ValueError(f"{page.file.src_path}: unknown generated section {name!r}; known: {sorted(GENERATORS)}")
        return GENERATORS[name]()

    return MARKER.sub(generate, markdown)


def _cell(text: str) -> str:
    """Plain text as one markdown table cell: one line; pipes and angle brackets (results/<machine>) escaped."""
    text = " ".join(str(text).split()).replace("\\[", "[").replace("|", "\\|")  # help escapes rich markup
    return text.replace("<", "&lt;").replace(">", "&gt;")


# -- the CLI reference ---------------------------------------------------------------------------------------


def cli_reference() -> str:
    import typer.main

    from kvbench.cli.app import app

    group = typer.main.get_command(app)
    root = group.make_context("kvbench", [], resilient_parsing=True)
    out = []
    for name in group.list_commands(root):
        command = group.get_command(root, name)
        ctx = command.make_context(name, [], parent=root, resilient_parsing=True)
        out += [f"## kvbench {name}", "", _cell(command.help or ""), ""]
        out += ["```", command.get_usage(ctx).strip(), "```", ""]
        arguments = [p for p in command.get_params(ctx) if p.param_type_name == "argument"]
        options = [p for p in command.get_params(ctx) if p.param_type_name == "option" and not p.hidden]
        if arguments:
            out += ["| argument | description |", "|---|---|"]
            out += [f"| `{p.name.upper()}` | {_cell(getattr(p, 'help', None) or '')} |" for p in arguments]
            out.append("")
        if options:
            out += ["| option | description |", "|---|---|"]
            for p in options:
                flags, text = p.get_help_record(ctx)
                out.append(f"| `{flags}` | {_cell(text)} |")
            out.append("")
        if command.context_settings.get("ignore_unknown_options"):
            out += ["Arguments after `--` are passed to vLLM verbatim.", ""]
    return "\n".join(out)


# -- the record schema ---------------------------------------------------------------------------------------


def _comments(model: type) -> dict[str, str]:
    """Trailing `# comments` of a class's field lines: records/schema.py documents its fields that way."""
    try:
        source = inspect.getsource(model)
    except (OSError, TypeError):
        return {}
    found, field = {}, None
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.NAME and tok.start[1] == 4 and field is None:
            field = (tok.string, tok.start[0])
        elif tok.type == tokenize.COMMENT and field and tok.start[0] == field[1]:
            found[field[0]] = tok.string.lstrip("# ").strip()
        if tok.type in (tokenize.NEWLINE, tokenize.NL):
            field = None
    return found


def _models_in(annotation) -> list[type]:
    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel | Enum):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _type_name(annotation) -> str:
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and not typing.get_args(annotation):
        link = annotation.__name__
        return f"[{link}](#{link.lower()})" if _models_in(annotation) else f"`{link}`"
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in args)
    if origin is typing.Literal:
        return " or ".join(f"`{a!r}`" for a in args)
    if origin in (list, tuple, set):
        return f"list of {_type_name(args[0])}" if args else "`list`"
    if origin is dict:
        return f"object of {_type_name(args[1])}" if args else "`object`"
    return f"`{annotation}`".replace("typing.", "")


def _default(info) -> str:
    from pydantic_core import PydanticUndefined

    if info.is_required():
        return "required"
    if info.default_factory is not None:
        empty = info.default_factory()
        return f"`{empty!r}`" if empty in ({}, []) else f"a new `{type(empty).__name__}`"
    if info.default is PydanticUndefined:
        return ""
    value = info.default.value if isinstance(info.default, Enum) else info.default
    return f"`{value!r}`" if value is not None else "`null`"


def _bounds(info) -> str:
    words = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    return ", ".join(f"{words[k]} {getattr(m, k)}" for m in info.metadata for k in words if hasattr(m, k))


def record_schema() -> str:
    from kvbench import records

    out = [
        f"Schema **`{records.SCHEMA}`** (readers also accept `{records.SCHEMA_V1}`, upgraded on load). "
        "Every type keeps keys it does not know (a newer kvbench may add some); known keys must have the type "
        "and range below. Field names are the JSON keys.",
        "",
    ]
    seen, queue = [], [records.RunRecord]
    while queue:
        model = queue.pop(0)
        if model in seen:
            continue
        seen.append(model)
        out += [f"### {model.__name__}", ""]
        if issubclass(model, Enum):
            notes = _comments(model)
            out += ["| value | meaning |", "|---|---|"]
            out += [f"| `{m.value}` | {_cell(notes.get(m.name, ''))} |" for m in model]
            out.append("")
            continue
        doc = inspect.getdoc(model)
        if doc and doc != inspect.getdoc(model.__mro__[1]):
            out += [_cell(doc), ""]
        notes = _comments(model)
        hints = typing.get_type_hints(model, vars(sys.modules[model.__module__]))  # resolves forward references
        out += ["| field | type | default | allowed | meaning |", "|---|---|---|---|---|"]
        for name, info in model.model_fields.items():
            key = info.alias or name
            meaning = info.description or notes.get(name, "")
            out.append(
                f"| `{key}` | {_type_name(hints[name])} | {_default(info)} | {_bounds(info)} | {_cell(meaning)} |"
            )
            queue += [m for m in _models_in(hints[name]) if m not in seen]
        out.append("")
    return "\n".join(out)


GENERATORS = {"cli-reference": cli_reference, "record-schema": record_schema}
