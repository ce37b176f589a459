"""What many test files share, declared once: the repository's paths, the `kvbench` command as a user runs it,
and reading the one record a run wrote. Importable from every tier (pyproject's pytest `pythonpath`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

from kvbench import records
from kvbench.core.datafiles import data_path, load_toml

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
KVBENCH = [sys.executable, "-m", "kvbench"]
# The CPU default's server arguments (kvbench/data/run_defaults.toml), so tests see what users see.
CPU = load_toml("run_defaults.toml")["cpu"]
CPU_ARGS = [*CPU["extra_args"], "--kv-cache-memory-bytes", str(CPU["kv_cache_memory_bytes"])]


def kvbench(*args: str, cwd: Path | str = ROOT, env: dict | None = None, timeout: float = 900):
    """`kvbench ARGS` in a child process, as a user runs it. A wide terminal (pytest's 80 columns would wrap
    tables) and no OPENAI_API_KEY from the developer's shell: tests pass their keys explicitly."""
    full = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    full.update(COLUMNS="220", **(env or {}))
    return subprocess.run([*KVBENCH, *args], cwd=cwd, capture_output=True, text=True, env=full, timeout=timeout)


def kvbench_here(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`kvbench ARGS` in this process, giving what `kvbench` gives (exit status, stdout, stderr) without a child's
    start-up (0.7-2.5 s of imports: most of a short run against a fake server). What the process boundary itself
    decides (stdout holding one JSON document, signals, exit on SIGHUP, the environment a child inherits) is
    tested through `kvbench`, and the e2e tier runs vLLM through it."""
    import contextlib
    import io

    from kvbench.cli.app import main

    out, err = io.StringIO(), io.StringIO()
    saved = dict(os.environ)
    os.environ.pop("OPENAI_API_KEY", None)
    os.environ.update(COLUMNS="220", **(env or {}))
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main([str(a) for a in args])
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return subprocess.CompletedProcess(["kvbench", *args], code, out.getvalue(), err.getvalue())


# For tests about something else than the front, repeats and eval: one pass at one load, no tasks.
LEAN = ["--no-sweep", "--repeat", "1", "--no-eval"]


def kvbench_at(
    command: str,
    endpoint: str,
    model,
    results,
    *args: str,
    json_out: bool = True,
    env: dict | None = None,
    child: bool = False,
):
    """`kvbench COMMAND --endpoint ENDPOINT --model MODEL ARGS --results RESULTS [--json]`: in this process against
    a fake server; `child` (real vLLM, e2e) in a child process, as a user runs it, apart from the session's
    shared servers, which are this process's children."""
    tail = ["--json"] if json_out else []
    argv = [command, "--endpoint", endpoint, "--model", str(model), *args, "--results", str(results), *tail]
    return kvbench(*argv, env=env) if child else kvbench_here(*argv, env=env)


def json_summary(out) -> dict:
    """The one JSON document a `--json` command printed, after checking that it exited 0."""
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def cpu_plan(results_dir: Path, **kw):
    """A run plan of the CPU default without the SLO search, the front, repeats or eval (RunSettings' plan)."""
    from kvbench.harness.run.defaults import build_plan
    from kvbench.harness.run.settings import RunSettings

    lean = dict(no_search=True, sweep=False, repeat=1, eval_tasks=[])
    return build_plan(RunSettings.for_machine(False, results_dir=results_dir, **{**lean, **kw}))


def only_record(results: Path) -> dict:
    """The one run record under `results` (a test's run writes exactly one)."""
    paths = records.find_records(results)
    assert len(paths) == 1, paths
    return records.load_record(paths[0])


def cli(capsys, *args) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of the kvbench command line, in-process (pytest's capsys captures it)."""
    import pytest

    from kvbench.cli.app import main

    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in args])
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def one_line_error(out) -> str:
    """The one stderr line of a refused command (exit 2)."""
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, (out.returncode, out.stderr[-2000:])
    return lines[0]


def everything_under(path: Path) -> str:
    """Every byte kvbench wrote (records, Parquet samples, logs, pages) as text, to look for secrets; Parquet
    decoded too (its zstd pages would hide a key from a plain byte search)."""
    import pyarrow.parquet as pq

    out = []
    for p in sorted(path.rglob("*")):
        if p.is_file():
            out.append(p.read_bytes().decode("latin-1"))
            if p.suffix == ".parquet":
                out.append(json.dumps(pq.read_table(p).to_pylist(), default=str))
    return "".join(out)


SHIPPED_NIGHTLY = tomllib.loads(data_path("nightly.toml").read_text())  # the shipped nightly config


def write_config(tmp_path: Path, raw: dict | str) -> Path:
    path = tmp_path / "nightly.toml"
    path.write_text(raw if isinstance(raw, str) else toml_text(raw))
    return path


def toml_text(d: dict, prefix: str = "") -> str:
    """Enough TOML for these configs: scalars, lists, nested tables."""
    scalars = {k: v for k, v in d.items() if not isinstance(v, dict)}
    tables = {k: v for k, v in d.items() if isinstance(v, dict)}
    out = [f"[{prefix}]"] if prefix and scalars else []
    out += [f"{k} = {json.dumps(v)}" for k, v in scalars.items()]
    for k, v in tables.items():
        name = f"{prefix}.{k}" if prefix else k
        out.append(toml_text(v, name))
    return "\n".join(out) + "\n"


def shipped(**changes) -> dict:
    """The shipped config with changes, given as dotted paths: shipped(**{"machines.h200.max_minutes": 1})."""
    raw = json.loads(json.dumps(SHIPPED_NIGHTLY))
    for dotted, value in changes.items():
        *parents, key = dotted.split(".")
        node = raw
        for p in parents:
            node = node.setdefault(p, {})
        if value is None:
            node.pop(key, None)
        else:
            node[key] = value
    return raw


def run_against(url: str, model, workload: str, tmp_path, *extra, child: bool = False) -> tuple[dict, object]:
    """One lean `kvbench run` of `workload` against the endpoint at `url`: (its record, its requests)."""
    json_summary(kvbench_at("run", f"auto={url}", model, tmp_path, "--workload", workload, *LEAN, *extra, child=child))
    path = records.find_records(tmp_path)[0]
    return records.load_record(path), records.samples_frame(path)


def plan_for(tmp_path, dtypes: str, **kw):
    """A lean CPU plan of `dtypes` ("auto,fp8") into tmp_path (cpu_plan)."""
    return cpu_plan(tmp_path, kv_dtypes=dtypes.split(","), **kw)


SKY_SCHEMA = ROOT / "sky" / "task.schema.json"  # SkyPilot's task schema, vendored (its $comment names the source)


def sky_validator():
    import jsonschema

    def case_insensitive_enum(validator, enums, instance, schema):
        # SkyPilot's own keyword (sky.utils.schemas): an enum compared case-insensitively
        if isinstance(instance, str) and instance.lower() not in {str(e).lower() for e in enums}:
            yield jsonschema.ValidationError(f"{instance!r} is not one of {enums}")

    base = jsonschema.Draft202012Validator
    cls = jsonschema.validators.extend(base, {"case_insensitive_enum": case_insensitive_enum})
    schema = json.loads(SKY_SCHEMA.read_text())
    base.check_schema(schema)
    return cls(schema)


def sky_errors(doc: dict) -> list[str]:
    """What the vendored SkyPilot task schema says is wrong with a task document ([] when it accepts it)."""
    return [f"{'/'.join(map(str, e.path))}: {e.message}" for e in sky_validator().iter_errors(doc)]


def committed_results() -> Path:
    """A private copy of the committed results/ (`git ls-files results`), made once per test process: tests
    read the records the repository ships, never what a user's `make run` added to the checkout since
    (issue 36). Outside a git checkout (an sdist), the folder as found."""
    global _COMMITTED
    if _COMMITTED is None:
        import atexit
        import shutil
        import tempfile

        src = ROOT
        listed = subprocess.run(["git", "ls-files", "-z", "results"], cwd=src, capture_output=True)
        names = [n for n in listed.stdout.decode().split("\0") if n] if listed.returncode == 0 else []
        if not names:
            return src / "results"
        tmp = Path(tempfile.mkdtemp(prefix="kvbench-committed-"))
        atexit.register(shutil.rmtree, tmp, True)
        for name in names:
            dst = tmp / name
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src / name, dst)
        _COMMITTED = tmp / "results"
    return _COMMITTED


_COMMITTED: Path | None = None


def predict_reference_log(path: Path, cases: dict):
    """A reference start-up log parsed, and kvbench's prediction for it (kvbench.cli.commands.fromlog.predict_for_log:
    spec, card, estimate, row, ...) under the overrides its cases.toml entry gives."""
    from kvbench.cli.commands.fromlog import LogOverrides, predict_for_log
    from kvbench.core.logparse import parse_startup_log

    case = cases.get(path.name, {})
    log = parse_startup_log(path.read_text())
    flags = LogOverrides(
        model=case.get("model"),
        gpu=case.get("gpu"),
        context=case.get("max_model_len"),
        utilization=case.get("utilization"),
        weights=case.get("weights"),
        vllm_version=case.get("vllm_version", cases["default_vllm_version"]),
    )
    return log, predict_for_log(log, path, flags)
