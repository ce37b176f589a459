"""The docs' generated pages (docs/hooks.py) cover the whole CLI and the whole record schema.

`mkdocs build --strict` (make test) catches broken links and pages left out of the nav; these catch a generator
that silently leaves something out.
"""

import importlib.util
import re
from pathlib import Path

import pytest
import typer.main
from pydantic import BaseModel

from kvbench import records
from kvbench.cli.app import app

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def hooks():
    spec = importlib.util.spec_from_file_location("kvbench_docs_hooks", REPO / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cli_reference_has_every_command_and_option(hooks):
    text = hooks.cli_reference()
    group = typer.main.get_command(app)
    ctx = group.make_context("kvbench", [], resilient_parsing=True)
    names = group.list_commands(ctx)
    assert re.findall(r"^## kvbench (\S+)$", text, re.MULTILINE) == names
    for name in names:
        command = group.get_command(ctx, name)
        section = text.split(f"## kvbench {name}\n", 1)[1].split("\n## ", 1)[0]
        for param in command.get_params(ctx):
            if param.param_type_name == "option" and not param.hidden:
                assert all(opt in section for opt in param.opts), (name, param.opts)
            elif param.param_type_name == "argument":
                assert f"`{param.name.upper()}`" in section, (name, param.name)
    assert "Arguments after `--` are passed to vLLM verbatim." in text.split("## kvbench run\n")[1].split("\n## ")[0]


def test_the_record_schema_has_every_type_and_field(hooks):
    text = hooks.record_schema()
    # every record type in kvbench/records/schema.py is reachable from RunRecord: each gets a section with all
    # its fields
    models = [
        m
        for m in vars(records.schema).values()
        if isinstance(m, type) and issubclass(m, BaseModel) and m.__module__ == records.schema.__name__
    ]
    assert records.Front in models and records.Distribution in models
    for model in models:
        if model.__name__.startswith("_"):
            continue
        assert f"### {model.__name__}\n" in text, model.__name__
        section = text.split(f"### {model.__name__}\n", 1)[1].split("\n### ", 1)[0]
        for name, info in model.model_fields.items():
            assert f"| `{info.alias or name}` |" in section, (model.__name__, name)
    for enum in (records.RunStatus, records.DtypeStatus, records.PhaseKind, records.StopReason):
        assert all(f"| `{member.value}` |" in text for member in enum)
    assert "ForwardRef" not in text  # `front: Front | None` is declared before Front
    assert f"`{records.SCHEMA}`" in text


def test_an_unknown_marker_fails_the_build(hooks):
    page = type("Page", (), {"file": type("File", (), {"src_path": "x.md"})()})()
    with pytest.raises(ValueError, match="unknown generated section 'nope'"):
        hooks.on_page_markdown("a\n<!-- generated: nope -->\nb", page, None, None)
    assert hooks.on_page_markdown("no marker here", page, None, None) == "no marker here"
