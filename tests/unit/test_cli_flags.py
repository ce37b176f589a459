"""Every `kvbench` command (tinymodel's subcommands too) keeps the flags and arguments it has: the command line
is generated from settings models (kvbench/cli/clisettings.py), and a refactor of those must not add, drop or
rename a flag by accident. A deliberate change updates tests/data/cli_flags.json:

    .venv/bin/python tests/unit/test_cli_flags.py > tests/data/cli_flags.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

SNAPSHOT = Path(__file__).resolve().parents[1] / "data" / "cli_flags.json"


def cli_flags() -> dict[str, dict[str, list[str]]]:
    """{"tinymodel train": {"options": [...], "arguments": [...]}, ...} for every leaf command, read from click."""
    import typer

    from kvbench.cli.app import app

    out: dict[str, dict[str, list[str]]] = {}

    def walk(command, path: list[str]) -> None:
        subcommands = getattr(command, "commands", None)  # a group (typer vendors click: duck-typed)
        if subcommands:
            for name, sub in subcommands.items():
                walk(sub, [*path, name])
            return
        params = command.params
        out[" ".join(path)] = {
            "options": sorted(
                {o for p in params if p.param_type_name == "option" for o in (*p.opts, *p.secondary_opts)}
            ),
            "arguments": [p.name for p in params if p.param_type_name == "argument"],
        }

    walk(typer.main.get_command(app), [])
    return dict(sorted(out.items()))


def test_every_command_keeps_its_flags():
    expected = json.loads(SNAPSHOT.read_text())
    got = cli_flags()
    assert sorted(got) == sorted(expected), "commands added or removed"
    changed = {name: (expected[name], got[name]) for name in expected if got[name] != expected[name]}
    assert not changed, f"flags changed (expected, got): {changed}"


def test_dashboard_help_names_every_registered_page():
    """The help is read from the page registry (kvbench/dashboards/site.py PAGES), so a new page shows in it."""
    from typer.testing import CliRunner

    from kvbench.cli.app import app
    from kvbench.dashboards.site import PAGES

    result = CliRunner().invoke(app, ["dashboard", "--help"], env={"COLUMNS": "100", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    squeeze = lambda text: "".join(text.replace("│", "").split()).lower()  # noqa: E731 rich wraps and boxes it
    missing = [page.TITLE for page in PAGES if squeeze(page.TITLE) not in squeeze(result.output)]
    assert not missing, f"kvbench dashboard --help does not name: {missing}\n{result.output}"


SHARED = {  # kvbench/specs/options.py: flag -> the Annotated type that declares it
    "--model": "Model",
    "--results": "Results",
    "--json": "AsJson",
    "--machine": "Machine",
    "--kv-dtypes": "KvDtypes",
    "--endpoint": "Endpoint",
    "--api-key": "ApiKey",
    "--header": "Header",
    "--threshold": "Threshold",
    "--startup-timeout": "StartupTimeout",
}


def test_shared_options_are_declared_once():
    """Each shared option's flag is declared in kvbench/specs/options.py only; a command may narrow its names on the
    shared type itself (Annotated[Model, Flag("--model")]), and declares no typer option of its own."""
    import re

    root = Path(__file__).resolve().parents[2]
    found = []
    for path in [*(root / "kvbench").rglob("*.py"), *(root / "harness").rglob("*.py")]:
        if path.relative_to(root) == Path("kvbench/specs/options.py"):
            continue
        text = path.read_text()
        if path.parent.name == "commands" and re.search(r"typer\.(Option|Argument)\(", text):
            found.append(f"{path.relative_to(root)}: declares a typer option inline")
        for m in re.finditer(r'Flag\(\s*"(--[a-z-]+)"', text):
            alias = SHARED.get(m.group(1))
            line = text[text.rfind("\n", 0, m.start()) + 1 : m.start()]
            if alias and not re.search(rf"Annotated\[\s*{alias},\s*$", line):
                found.append(f"{path.relative_to(root)}: {m.group(1)} (use kvbench.specs.options.{alias})")
    assert not found, found


@pytest.mark.parametrize(
    "argv",
    [
        ["compare", "a", "b", "--machine", "../up"],
        ["regress", "--machine", "../up"],
        ["history", "show", "--machine", "a/b"],
    ],
)
def test_the_shared_machine_check_refuses_a_path_in_one_line(argv, capsys):
    """--machine is one typed option (kvbench/specs/options.py Machine): every command that takes it refuses a name
    that is a path, in one line with exit 2, before reading anything."""
    from kvbench.cli.app import main

    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1 and "is not a usable machine name" in err, err


# One name per concept (CHANGELOG, round 11): the old spellings still work, hidden from --help and the docs.
RENAMED = {
    ("capacity", "--kv-dtype"): "--kv-dtypes",
    ("plan", "--kv-dtype"): "--kv-dtypes",
    ("accuracy", "--formats"): "--kv-dtypes",
    ("kernels", "--formats"): "--kv-dtypes",
    ("compare", "--config"): "--asv-config",
    ("history", "--config"): "--asv-config",
    ("regress", "--config"): "--asv-config",
}


def test_renamed_flags_keep_their_old_name_hidden():
    import typer

    from kvbench.cli.app import app

    commands = typer.main.get_command(app).commands
    for (name, old), new in RENAMED.items():
        params = {o: p for p in commands[name].params for o in p.opts}
        assert params[old].hidden and not params[new].hidden, (name, old, new)
        assert params[old] is not params[new]
    # the one meaning left for --config: nightly's own nightly.toml, beside its --asv-config
    nightly = {o: p for p in commands["nightly"].params for o in p.opts}
    assert not nightly["--config"].hidden and not nightly["--asv-config"].hidden


def test_an_old_flag_name_sets_the_same_setting(capsys):
    from kvbench.cli.app import main

    base = ["capacity", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-c", "4096", "--json"]
    outputs = []
    for flag in ("--kv-dtypes", "--kv-dtype"):
        with pytest.raises(SystemExit) as exit_:
            main([*base, flag, "fp8"])
        assert exit_.value.code in (0, None)
        outputs.append([r["dtype"] for r in json.loads(capsys.readouterr().out)["rows"]])
    assert outputs == [["fp8"], ["fp8"]]


def test_old_and_new_name_together_is_one_line(capsys):
    from kvbench.cli.app import main

    with pytest.raises(SystemExit) as exit_:
        main(["capacity", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--kv-dtypes", "fp8", "--kv-dtype", "auto"])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and err.splitlines() == [
        "kvbench: error: --kv-dtype is the old name of --kv-dtypes: give one of them"
    ], err


if __name__ == "__main__":
    sys.stdout.write(json.dumps(cli_flags(), indent=1) + "\n")
