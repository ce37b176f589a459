"""kernels/run_on_gpu.sh's sweep mode, dry-run in Triton's interpreter (small shape, tiny grid): every variant and
candidate is checked against its torch reference, the grid is timed for each, the fastest correct one is kept,
and the one record holds all of it, with the NVML trace and device memory marked as not collected."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "kernels" / "run_on_gpu.sh"


def _run(tmp_path, **env):
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable, **env}
    env.pop("TRITON_INTERPRET", None)
    return subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=env, timeout=300)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("sweep")
    out = _run(out_dir, MODE="sweep", DRY="1")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    files = list((out_dir / "results").glob("*/kernels/*.json"))
    assert len(files) == 1, files
    return json.loads(files[0].read_text()), (out_dir / "kernels.log").read_text()


def test_every_variant_and_candidate_is_checked_and_equals_its_reference(sweep):
    from kvbench.kernels import sweep as sw

    doc, log = sweep
    checks = doc["sweep"]["checks"]
    assert doc["mode"] == "interpret" and doc["status"] == "complete" and doc["sweep"]["all_checks_ok"]
    assert all(c["ok"] for c in checks + doc["checks"]), [c for c in checks if not c["ok"]]
    for fmt in ("fp16", "fp8", "nvfp4"):
        want = [("full", c) for c in sw.decode_candidates(fmt, True)] + sw.variant_runs(fmt, True)
        want += [("write", c) for c in sw.write_candidates(fmt, True)]
        got = [(c["variant"], c["config"]) for c in checks if c["format"] == fmt]
        assert sorted(map(str, got)) == sorted(map(str, want)), fmt
    # the nvfp4 candidates include the f16 dequant and the bit-trick encoder, each checked
    assert {c["config"].get("dequant") for c in checks if c["format"] == "nvfp4"} >= {"f32", "f16"}
    assert {c["config"].get("encode") for c in checks if c["format"] == "nvfp4"} >= {"compare", "bits"}
    assert {c["config"].get("mma") for c in checks if c["variant"] == "full"} == {"dot", "fma"}
    assert f"{len(checks)}/{len(checks)} variant and candidate checks passed" in log and "exit 0" in log


def test_the_fastest_correct_candidate_is_kept_per_format_and_shape(sweep):
    doc, _ = sweep
    allrows = doc["sweep"]["decode_all"]
    for r in doc["decode"]:
        same = [
            a for a in allrows if (a["format"], a["batch"], a["context"]) == (r["format"], r["batch"], r["context"])
        ]
        assert r["variant"] == "full" and r["time_us"] == min(a["time_us"] for a in same)
    assert {r["format"] for r in doc["decode"]} == {"fp16", "fp8", "nvfp4"}
    assert {r["format"] for r in doc["write"]} == {"fp16", "fp8", "nvfp4"}
    assert doc["ratios"] and doc["targets"] is None  # no GPU, no targets judged


def test_variants_give_the_bound_of_the_as_is_kernel(sweep):
    doc, _ = sweep
    variants = {(r["format"], r["variant"], r["config"]["dequant"]) for r in doc["sweep"]["decode_variants"]}
    for fmt in ("fp16", "fp8", "nvfp4"):
        assert {(fmt, v, "f32") for v in ("full", "load_only", "dequant_only")} <= variants
    assert ("nvfp4", "dequant_only", "f16") in variants
    bounds = {b["format"]: b for b in doc["sweep"]["bounds"]}
    assert set(bounds) == {"fp16", "fp8", "nvfp4"}
    for b in bounds.values():
        assert sum(b["share"].values()) == pytest.approx(1.0, abs=1e-5)  # the record keeps 6 digits
        assert b["gbs"]["load_only"] > 0 and b["pct_of_copy"]["load_only"] is None  # a CPU copy is no baseline


def test_no_gpu_means_no_trace_and_no_memory_view_but_phases_are_marked(sweep):
    doc, log = sweep
    for part in (doc["telemetry"], doc["device_memory"]):
        assert part["available"] is False and part["reason"].startswith("no GPU: not collected")
    names = [p["name"] for p in doc["telemetry"]["phases"]]
    assert {"copy baseline", "decode grid", "write grid", "check nvfp4"} <= set(names)
    cases = [p for p in doc["telemetry"]["phases"] if p.get("kind") == "case"]
    assert cases and all(p["t_end"] >= p["t_start"] and p["gbs"] > 0 for p in cases)
    assert "NVML trace: no GPU: not collected" in log


def test_a_wrong_mode_is_one_line_and_exit_2(tmp_path):
    out = _run(tmp_path, MODE="fast")
    assert out.returncode == 2
    assert out.stderr.strip() == "run_on_gpu.sh: MODE must be grid (the default) or sweep, got 'fast'"


def test_an_interrupted_sweep_still_writes_what_it_measured(tmp_path):
    # run_on_gpu.sh's hard timeout sends SIGINT; here the interrupt arrives as the candidate checks begin
    code = (
        "import os; os.environ['TRITON_INTERPRET'] = '1'\n"
        "from kvbench.kernels import sweep\n"
        "def stop(*a): raise KeyboardInterrupt\n"
        "sweep._checks = stop\n"
        f"sweep.run({str(tmp_path)!r})\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    (path,) = tmp_path.glob("*/kernels/*.json")
    doc = json.loads(path.read_text())
    assert doc["status"] == "interrupted" and doc["copy_baseline"]["gbs"] > 0 and doc["checks"]
    assert doc["decode"] == [] and "status: interrupted" in out.stdout
