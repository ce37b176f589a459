"""Quality under load inside `kvbench run`: a dtype whose outputs are right one request at a time and wrong
under load is excluded from the recommendation (accuracy inferior at load), and its canaries say so too. The fake
server stands in for such an engine (it answers kvbench's pass-key task, wrongly above a concurrency)."""

from __future__ import annotations

import contextlib

import pytest
from support import json_summary, kvbench_at

from kvbench import records
from kvbench.testing.fakeserver import FakeConfig, FakeServer


def run_servers(servers: dict[str, FakeServer], model, results, *args: str):
    """One `kvbench run --json` of each dtype on its server ({dtype: server}) at one load (no search, no sweep)."""
    endpoints = ",".join(f"{dtype}={srv.base_url}" for dtype, srv in servers.items())
    return kvbench_at("run", endpoints, model, results, "--no-search", "--no-sweep", "--repeat", "1", *args)


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
        out = run_servers(
            {"auto": a, "fp8": b},
            trained_model,
            tmp_path,
            "--concurrency",
            "8",
            "--num-requests",
            "32",
            "--eval-tasks",
            "kvbench_passkey_512",  # the task the fake server can answer
            "--eval-limit",
            "24",
        )
    summary = json_summary(out)
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
    conditions = {"rest", "load", "batched", "mixed", "prefix", "during_load"}  # harness/quality/evalphase.py
    assert set(items.condition) == conditions and len(items) == 2 * 6 * 24  # every item kept
    # fidelity per token (harness/quality/fidelity.py): auto's floor at zero, fp8 changed at load and not at rest
    fid = {d["kv_cache_dtype"]: d["fidelity"] for d in doc["dtypes"]}
    assert fid["auto"]["load"]["mean_kld"] == 0.0 and fid["fp8"]["rest"]["mean_kld"] == 0.0
    assert fid["fp8"]["load"]["mean_kld"] > 0 and fid["fp8"]["load"]["top1_agreement"] < 1
    # at rest every item the eval answers at rest (24), at load the first 10 (auto's load, fp8's rest and load)
    assert fid["fp8"]["rest"]["items"] == 24 and fid["fp8"]["load"]["items"] == fid["auto"]["load"]["items"] == 10
    assert len(records.samples_frame(records.find_records(tmp_path), "fidelity")) == 10 + 24 + 10


FAILURE_MODES = {
    # fault on a server -> the condition the verdict must name
    "batched": ({"corrupt_above": 8}, "batched (32 in flight on both)"),
    "mixed": ({"corrupt_beside_prefill": True}, "mixed steps (4 at a time beside concurrency-2 traffic"),
    "prefix": ({"corrupt_cached": True}, "prefix-cache hit (1 at a time, the first 75% of each prompt cached"),
    "degenerate": ({"degenerate_every": 3}, "degenerate answers: "),
}
# Two faulty dtypes per run (fp8 and fp8_e5m2, both 8-bit: each pages twice auto's tokens, as its format implies,
# so its one fault is the only thing wrong with it), which halves the runs without sharing a fault between them.
PAIRS = [("batched", "mixed"), ("prefix", "degenerate")]


@pytest.mark.parametrize("modes", PAIRS, ids=["-".join(p) for p in PAIRS])
def test_each_failure_mode_condition_catches_a_dtype_that_fails_only_there(modes, tmp_path, trained_model):
    """The field's failure modes (harness/quality/failuremodes.py), one per dtype: a server right everywhere but in one
    condition is excluded, and the verdict names that condition; auto, right everywhere, is recommended."""
    # a 20 ms prefill gives "mixed" steps something to overlap; the other faults do not depend on it
    ttft = 0.02 if "mixed" in modes else 0.005
    common = dict(answers="passkey", max_model_len=512, ttft_s=ttft, itl_s=0.001)
    faulty = dict(zip(("fp8", "fp8_e5m2"), modes, strict=True))
    with contextlib.ExitStack() as stack:
        servers = {"auto": stack.enter_context(FakeServer(FakeConfig(kv_cache_dtype="auto", **common)))}
        for dtype, mode in faulty.items():
            cfg = FakeConfig(kv_cache_dtype=dtype, num_gpu_blocks=2048, **common, **FAILURE_MODES[mode][0])
            servers[dtype] = stack.enter_context(FakeServer(cfg))
        out = run_servers(
            servers,
            trained_model,
            tmp_path,
            "--concurrency",
            "4",
            "--num-requests",
            "16",
            "--eval-tasks",
            "kvbench_passkey_512",
            "--eval-limit",
            "20",
        )
    summary = json_summary(out)
    gate = summary["quality"]["gate"]
    assert gate["auto"]["eligible"], gate
    assert summary["quality"]["recommendation"]["dtype"] == "auto"
    for dtype, mode in faulty.items():
        assert not gate[dtype]["eligible"], gate
        named = FAILURE_MODES[mode][1]
        assert named in gate[dtype]["reason"], gate[dtype]["reason"]
        evals = summary["eval"][dtype]
        assert set(evals) >= {"rest", "load", "batched", "mixed", "prefix", "during_load"}, set(evals)
        task = "kvbench_passkey_512"
        if mode != "degenerate":  # the faulty condition loses most items to auto (batched: those beyond 8 in
            # flight; mixed: those beside a prefill); every other condition none
            for cond, summary_ in evals.items():
                vs = summary_["tasks"][task].get("vs_auto") or {}
                want = (vs["losses"] >= vs["n"] // 2) if cond == mode else (vs["losses"] == 0)
                assert want, (dtype, cond, vs, summary_.get("traffic"))
        else:
            junk = {cond: s["degenerate"]["empty"] for cond, s in evals.items()}
            assert all(n > 0 for n in junk.values()), junk
        if mode == "prefix":  # the condition says how much of each prompt it had cached
            assert evals["prefix"]["prefix_share"] == 0.75
