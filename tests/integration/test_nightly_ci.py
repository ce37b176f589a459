"""The nightly's CI files validate, and broken copies of them do not: .github/workflows/nightly.yml against
actionlint when it is installed, else check-jsonschema's vendored GitHub-workflow schema (the dev extra;
no network); sky/nightly.yaml against SkyPilot's task schema vendored in sky/task.schema.json (and against
SkyPilot itself when it is installed). Plus what the files must say to match the config and the CLI."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support import SKY_SCHEMA, sky_errors

from kvbench.orchestration.nightly import config as nconfig

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "nightly.yml"
SKY_TASK = ROOT / "sky" / "nightly.yaml"


def load_yaml(path: Path) -> dict:
    # YAML 1.1 reads the key `on` as True; GitHub reads it as "on"
    doc = yaml.safe_load(path.read_text())
    if True in doc:
        doc["on"] = doc.pop(True)
    return doc


# -- the workflow ---------------------------------------------------------------------------------------


def _tool(name: str) -> str | None:
    return shutil.which(name) or (
        str(Path(sys.executable).parent / name) if (Path(sys.executable).parent / name).exists() else None
    )


def validate_workflow(path: Path) -> tuple[bool, str]:
    """(valid, output) from actionlint if installed, else check-jsonschema's vendored workflow schema."""
    if actionlint := _tool("actionlint"):
        out = subprocess.run(
            [actionlint, "-config-file", str(ROOT / ".github" / "actionlint.yaml"), str(path)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    elif checker := _tool("check-jsonschema"):
        out = subprocess.run(
            [checker, "--builtin-schema", "vendor.github-workflows", str(path)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    else:
        pytest.skip("neither actionlint nor check-jsonschema is installed (pip install -e '.[dev]')")
    return out.returncode == 0, out.stdout + out.stderr


def test_workflow_validates():
    ok, output = validate_workflow(WORKFLOW)
    assert ok, output


@pytest.mark.parametrize("breakage", ["runs_on", "steps_map", "bad_yaml", "no_jobs"])
def test_a_broken_workflow_fails_validation(tmp_path, breakage):
    text = WORKFLOW.read_text()
    if breakage == "runs_on":
        text = text.replace("    runs-on: ubuntu-latest\n", "    runs_on: ubuntu-latest\n", 1)
    elif breakage == "steps_map":
        doc = load_yaml(WORKFLOW)
        doc["jobs"]["merge"]["steps"] = {"checkout": {"uses": "actions/checkout@v4"}}
        text = yaml.safe_dump(doc)
    elif breakage == "bad_yaml":
        text = text.replace("      - name: Dashboard\n", "      - name: Dashboard: site\n", 1)
    else:
        doc = load_yaml(WORKFLOW)
        del doc["jobs"]
        text = yaml.safe_dump(doc)
    assert text != WORKFLOW.read_text()
    broken = tmp_path / ".github" / "workflows" / "nightly.yml"
    broken.parent.mkdir(parents=True)
    broken.write_text(text)
    ok, output = validate_workflow(broken)
    assert not ok, output


def test_workflow_runs_the_nightly_on_every_configured_gpu_then_merges_and_publishes():
    wf = load_yaml(WORKFLOW)
    assert "schedule" in wf["on"] and "workflow_dispatch" in wf["on"]
    gpu = wf["jobs"]["gpu"]
    cfg, _ = nconfig.load()
    labels = {m.label for m in cfg.machines.values() if m.label}
    assert set(gpu["strategy"]["matrix"]["label"]) == labels == {"a100", "h100", "h200"}
    assert gpu["strategy"]["fail-fast"] is False
    assert gpu["runs-on"] == ["self-hosted", "${{ matrix.label }}"]
    runs = "\n".join(s.get("run", "") for s in gpu["steps"])
    assert (
        "uv pip install -e '.[gpu]'" in runs and "kvbench nightly --config" in runs and "--print install-args" in runs
    )
    assert gpu["timeout-minutes"] > max(cfg.machines[k].max_minutes for k in cfg.machines if cfg.machines[k].label)
    uploads = [s for s in gpu["steps"] if str(s.get("uses", "")).startswith("actions/upload-artifact")]
    assert any("results/${{ steps.machine.outputs.name }}/" in s["with"]["path"] for s in uploads)
    assert all(s.get("if", "").startswith("always()") for s in uploads)  # a failed night still uploads
    assert gpu["if"] == "(inputs.runner || vars.KVBENCH_RUNNER || 'sky') == 'self-hosted'"  # the option kept
    merge = wf["jobs"]["merge"]
    assert merge["needs"] == "gpu" and merge["if"] == "always() && needs.gpu.result != 'skipped'"
    merge_runs = "\n".join(s.get("run", "") for s in merge["steps"])
    assert "kvbench regress" in merge_runs and "kvbench dashboard" in merge_runs and "git push" in merge_runs
    assert any(str(s.get("uses", "")).startswith("actions/upload-pages-artifact") for s in merge["steps"])
    pages = wf["jobs"]["pages"]
    assert pages["needs"] == ["fleet", "merge"] and pages["permissions"] == {"pages": "write", "id-token": "write"}
    assert pages["steps"][0]["uses"].startswith("actions/deploy-pages")
    assert wf["permissions"] == {"contents": "read"}  # write only where a job needs it


def test_the_default_night_needs_no_gpu_runner_launches_waits_merges_gates_and_publishes():
    wf = load_yaml(WORKFLOW)
    assert wf["on"]["workflow_dispatch"]["inputs"]["runner"]["options"] == ["sky", "self-hosted"]
    fleet = wf["jobs"]["fleet"]
    assert fleet["runs-on"] == "ubuntu-latest" and fleet["if"].endswith("== 'sky'")
    assert fleet["timeout-minutes"] <= 360  # GitHub-hosted runners stop at 6 hours
    env = fleet["env"]
    assert env["HF_TOKEN"] == "${{ secrets.HF_TOKEN }}" and env["AWS_SECRET_ACCESS_KEY"].startswith("${{ secrets.")
    runs = "\n".join(s.get("run", "") for s in fleet["steps"])
    assert "skypilot" in runs and "kvbench nightly --config" in runs and "--launch sky" in runs
    wait = int(runs.split("--wait ", 1)[1].split()[0])
    assert wait < fleet["timeout-minutes"]  # the wait gives up (and cancels the shards) before the job is killed
    assert "kvbench nightly --merge fleet/plan.json" in runs and "git push" in runs and "commits.bundle" in runs
    steps = {s.get("id"): s for s in fleet["steps"] if s.get("id")}
    assert steps["launch"]["continue-on-error"] and steps["merge"]["continue-on-error"]  # pages go out anyway
    assert any(str(s.get("uses", "")).startswith("actions/upload-pages-artifact") for s in fleet["steps"])
    assert "exit 1" in fleet["steps"][-1]["run"]  # ... and then the job fails on a regression or a failed shard
    assert fleet["permissions"] == {"contents": "write"}
    pages = wf["jobs"]["pages"]
    assert "needs.fleet.outputs.pages == 'true'" in pages["if"]


def test_workflow_and_sky_call_only_existing_nightly_options():
    from kvbench.cli.app import app

    cmd = next(c for c in app.registered_commands if c.name == "nightly")
    import typer.main

    params = {
        o
        for p in typer.main.get_command_from_info(cmd, pretty_exceptions_short=True, rich_markup_mode=None).params
        for o in p.opts
    }
    for path in (WORKFLOW, SKY_TASK, ROOT / "sky" / "shard.sh"):
        for line in path.read_text().splitlines():
            if "kvbench nightly" in line and not line.lstrip().startswith("#"):
                for word in line.split("kvbench nightly", 1)[1].split():
                    if word.startswith("--"):
                        assert word in params, f"{path.name}: {word}"


# -- the SkyPilot task ----------------------------------------------------------------------------------


def test_sky_schema_is_skypilots_with_its_source():
    schema = json.loads(SKY_SCHEMA.read_text())
    assert "SkyPilot" in schema["$comment"] and "get_task_schema" in schema["$comment"]
    assert "accelerators" in schema["properties"]["resources"]["properties"]


def test_sky_task_validates():
    task = load_yaml(SKY_TASK)
    assert sky_errors(task) == []
    assert task["resources"]["accelerators"].split(":")[0] in ("A100-80GB", "H100", "H200")
    assert (
        "uv pip install -e '.[gpu]'" in task["setup"]
        and "--print install-args" in task["setup"]
        and "kvbench nightly --config" in task["run"]
    )
    assert "HF_TOKEN" in task["secrets"] and task["workdir"] == "."


@pytest.mark.parametrize(
    "breakage,where",
    [
        (lambda t: t["resources"].__setitem__("accelerator", t["resources"].pop("accelerators")), "resources"),
        (lambda t: t.__setitem__("setup", ["pip install kvbench"]), "setup"),
        (lambda t: t.__setitem__("envs", {"1BAD NAME": "x"}), "envs"),
        (lambda t: t.__setitem__("runn", t.pop("run")), ""),
        (lambda t: t["resources"].__setitem__("disk_size", "lots"), "resources/disk_size"),
    ],
)
def test_a_broken_sky_task_fails_validation(breakage, where):
    task = copy.deepcopy(load_yaml(SKY_TASK))
    breakage(task)
    errors = sky_errors(task)
    assert errors and any(e.startswith(where) for e in errors), errors


def test_sky_task_with_skypilot_itself(tmp_path):
    sky = pytest.importorskip("sky", reason="SkyPilot is not installed (heavy; the vendored schema covers it)")
    if not hasattr(sky, "Task"):  # without SkyPilot, this repo's sky/ folder imports as a namespace package
        pytest.skip("SkyPilot is not installed (heavy; the vendored schema covers it)")
    task = sky.Task.from_yaml(str(SKY_TASK))
    assert task.run and task.setup
    broken = tmp_path / "task.yaml"
    broken.write_text(SKY_TASK.read_text().replace("  accelerators:", "  accelerator:"))
    with pytest.raises(Exception, match="accelerators"):
        sky.Task.from_yaml(str(broken))
