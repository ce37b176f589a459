"""Quality under load inside `kvbench run`: a dtype whose outputs are right one request at a time and wrong
under load is excluded from the recommendation (accuracy inferior at load), and its canaries say so too. The fake
server stands in for such an engine (it answers kvbench's pass-key task, wrongly above a concurrency)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from kvbench.harness import records
from kvbench.harness.fakeserver import FakeConfig, FakeServer


def kvbench(*args):
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("OPENAI_API_KEY", None)
    return subprocess.run(
        [sys.executable, "-m", "kvbench", *args], capture_output=True, text=True, env=env, timeout=900
    )


def test_a_dtype_wrong_only_under_load_is_excluded_and_its_canaries_report_it(tmp_path, trained_model):
    good = FakeConfig(answers="passkey", kv_cache_dtype="auto", max_model_len=512, ttft_s=0.005, itl_s=0.001)
    # fp8 pages twice auto's tokens, as the format implies, so the only thing wrong with it is its answers
    bad = FakeConfig(
        answers="passkey",
        kv_cache_dtype="fp8",
        max_model_len=512,
        ttft_s=0.005,
        itl_s=0.001,
        corrupt_above=4,
        num_gpu_blocks=2048,
    )
    with FakeServer(good) as a, FakeServer(bad) as b:
        out = kvbench(
            "run",
            "--endpoint",
            f"auto={a.base_url},fp8={b.base_url}",
            "--model",
            str(trained_model),
            "--no-search",
            "--no-sweep",
            "--repeat",
            "1",
            "--concurrency",
            "8",
            "--num-requests",
            "32",
            "--eval-limit",
            "60",
            "--results",
            str(tmp_path),
            "--json",
        )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout)
    gate = summary["quality"]["gate"]
    assert gate["auto"]["eligible"] and not gate["fp8"]["eligible"] and gate["fp8"]["breach"]
    assert gate["fp8"]["kind"] == "accuracy" and gate["fp8"]["accuracy"] == "inferior"
    assert "at load (8 in flight on both)" in gate["fp8"]["reason"]
    assert summary["quality"]["recommendation"]["dtype"] == "auto"
    fp8 = summary["eval"]["fp8"]
    task = "kvbench_passkey_512"
    assert fp8["rest"]["tasks"][task]["accuracy"] == 1.0  # right one request at a time ...
    load = fp8["load"]["tasks"][task]
    assert (
        load["accuracy"] < 0.9 and load["vs_rest"]["significant"] and load["vs_auto"]["significant"]
    )  # ... wrong under load
    doc = records.load_record(summary["record"])
    canaries = {d["kv_cache_dtype"]: [p["canaries"] for p in d["phases"]] for d in doc["dtypes"]}
    assert all(c["differ"] == 0 for c in canaries["auto"]) and any(c["differ"] > 0 for c in canaries["fp8"])
    assert any(f.get("dtype") == "fp8" and f["kind"] == "accuracy" for f in doc["findings"])
    # every condition's answers are fingerprinted, so identical ones can be told from equal counts
    assert all(len(t["scores_sha256"]) == 64 for c in ("rest", "load") for t in fp8[c]["tasks"].values())
    items = records.samples_frame(records.find_records(tmp_path), "evals")
    assert set(items.condition) == {"rest", "load", "during_load"} and len(items) == 2 * 3 * 60  # every item kept
