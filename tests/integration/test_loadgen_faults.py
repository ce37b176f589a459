"""Failures are kept, flagged and excluded; a hung server or a Ctrl-C ends a run with partial results."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from kvbench.harness.client.backend import OpenAIBackend
from kvbench.harness.client.metrics import summarize
from kvbench.harness.client.scheduler import Concurrency, LoadResult, Rate, run_load, run_sweep, sustain_load
from kvbench.testing.fakeserver import FakeConfig, FakeServer

P = [[5, 6, 7, 8]] * 12


@pytest.fixture(scope="module")
def fake():
    with FakeServer() as srv:
        yield srv


@pytest.fixture
def server(fake):
    fake.configure(**{**vars(FakeConfig()), "ttft_s": 0.005, "itl_s": 0.002, "tokens_per_chunk": 2})
    return fake


def run(url, mode=Concurrency(3), prompts=P, out=8, api="completions", timeout_s=30.0, **kw):
    backend = OpenAIBackend(url, "kvbench-fake", api=api, request_timeout_s=timeout_s)
    return asyncio.run(run_load(backend, prompts, out, mode, **kw))


def test_http_errors_counted_and_excluded(server):
    server.configure(fail_every=3)
    lr = run(server.base_url)
    s = summarize(lr)
    assert (s.completed, s.failed) == (8, 4)
    assert s.failure_reasons == {"HTTP 500": 4}
    bad = [r for r in lr.results if not r.ok]
    assert all(r.http_status == 500 and "fake failure" in r.error and r.ttft_s is None for r in bad)
    assert s.ttft_ms["n"] == s.e2e_ms["n"] == s.tpot_ms["n"] == 8  # latency stats: completed only
    assert s.total_completion_tokens == 8 * 8
    assert s.schedule_lag_ms["n"] == 12  # lag is the client's: every sent request
    assert not s.all_failed


def test_every_request_failing_is_detectable(server):
    server.configure(fail_every=1)
    s = summarize(run(server.base_url, Rate(200.0, max_concurrency=4)))
    assert s.all_failed and s.failed == 12
    assert json.loads(json.dumps(s.as_dict(), allow_nan=False))["all_failed"] is True


def test_hang_ends_by_no_progress_timeout_with_partial_results(server):
    server.configure(hang_every=4, hang_after_chunks=2)
    t0 = time.monotonic()
    lr = run(server.base_url, stall_timeout_s=0.5)
    took = time.monotonic() - t0
    s = summarize(lr)
    assert lr.stalled and not lr.interrupted
    assert took < 0.5 + 3.0  # the normal requests take ~0.1 s: the run ends soon after 0.5 s of silence
    assert (s.completed, s.failed, s.not_sent) == (9, 3, 0)
    assert s.failure_reasons == {"no progress for 0.5 s": 3}
    for r in lr.results:
        if not r.ok:
            assert r.error_kind == "no_progress"
            assert len(r.chunk_arrivals_s) == 2  # what arrived before the hang is kept
            assert r.ttft_s is not None


def test_hang_before_headers_and_unsent_requests(server):
    server.configure(hang_every=1, hang_after_chunks=0)  # nothing ever answers
    t0 = time.monotonic()
    lr = run(server.base_url, Concurrency(2), stall_timeout_s=0.3)
    assert time.monotonic() - t0 < 0.3 + 3.0
    s = summarize(lr)
    assert lr.stalled and s.all_failed
    assert (s.failed, s.not_sent) == (2, 10)
    assert all(r.http_status is None for r in lr.results)


def test_dropped_stream_fails_that_request_only(server):
    server.configure(drop_every=3, drop_after_chunks=2)
    lr = run(server.base_url)
    s = summarize(lr)
    assert (s.completed, s.failed) == (8, 4)
    assert s.failure_reasons == {"disconnect": 4}
    for r in lr.results:
        if r.ok:
            assert r.completion_tokens == 8
        else:
            assert len(r.chunk_arrivals_s) == 2 and r.completion_tokens is None


def test_stream_without_done_is_truncated(server):
    server.configure(send_done=False)
    s = summarize(run(server.base_url))
    assert s.all_failed and s.failure_reasons == {"truncated": 12}


def test_request_timeout(server):
    server.configure(hang_every=2, hang_after_chunks=1)
    s = summarize(run(server.base_url, timeout_s=0.3, stall_timeout_s=10))
    assert s.failure_reasons == {"timeout": 6} and s.completed == 6


def test_connection_refused(server):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: connections are refused
        s = summarize(run(f"http://127.0.0.1:{port}", stall_timeout_s=5))
    assert s.all_failed and s.failure_reasons == {"connect": 12}


def test_missing_usage_is_unknown_not_guessed(server):
    server.configure(usage=False)
    lr = run(server.base_url)
    s = summarize(lr)
    assert s.completed == 12
    assert all(r.completion_tokens is None and r.chunk_tokens == [None] * 4 for r in lr.results)
    assert s.completion_tokens_unknown == 12 and s.output_throughput_tps is None
    assert s.tpot_ms["n"] == 0 and s.itl_ms["n"] == 0 and s.itl_chunk_ms["n"] == 12 * 3


def test_chat_role_chunk_is_not_a_token(server):
    lr = run(server.base_url, prompts=["hello there"] * 4, api="chat")
    s = summarize(lr)
    assert s.completed == 4
    for r in lr.results:
        assert r.chunk_tokens == [2, 2, 2, 2] and r.completion_tokens == 8
        assert r.first_chunk_s <= r.ttft_s  # vLLM's first-choices chunk is the role-only opener
    assert s.prompt_lengths_exact is False


def test_cancel_returns_partial_results_and_closes_the_session(server):
    server.configure(ttft_s=0.01, itl_s=0.05)  # each request ~0.16 s

    async def main():
        backend = OpenAIBackend(server.base_url, "kvbench-fake")
        first_wave_done = asyncio.Event()

        def progress(done, total):
            if done == 3:
                first_wave_done.set()

        task = asyncio.ensure_future(run_load(backend, P, 8, Concurrency(3), on_progress=progress))
        await first_wave_done.wait()
        await asyncio.sleep(0.05)  # the second wave is in flight, mid-stream
        task.cancel()
        result = await task
        return result, backend

    lr, backend = asyncio.run(main())
    s = summarize(lr)
    assert lr.interrupted and not lr.stalled
    assert s.completed == 3 and s.failed == 3 and s.not_sent == 6
    assert s.failure_reasons == {"cancelled": 3}
    assert all(len(r.chunk_arrivals_s) >= 1 for r in lr.results if not r.ok)
    assert not backend.is_open


def test_sustained_load_goes_on_in_fresh_chunks_until_cancelled(server):
    # A background load for as long as something else takes (an evaluation): never built up front.
    server.configure(ttft_s=0.001, itl_s=0.001)
    asked = []

    def prompts(k, n):
        asked.append((k, n))
        return [[10 + k, 11, 12, 13]] * n

    async def main():
        backend = OpenAIBackend(server.base_url, "kvbench-fake")
        task = asyncio.ensure_future(sustain_load(backend, prompts, 4, Concurrency(2)))
        while len(asked) < 3:  # past two whole chunks
            await asyncio.sleep(0.01)
        task.cancel()
        return await task, backend

    lr, backend = asyncio.run(main())
    s = summarize(lr)
    assert [k for k, _ in asked] == list(range(len(asked))) and {n for _, n in asked} == {64}  # 8 x concurrency 2
    assert lr.interrupted and not lr.stalled and lr.mode["chunks"] >= 2
    assert s.completed >= 2 * 64 and s.completed + s.failed + s.not_sent == lr.requested
    assert not backend.is_open


def test_ctrl_c_under_asyncio_run_returns_what_was_measured(server, tmp_path):
    server.configure(ttft_s=0.01, itl_s=0.05)
    script = tmp_path / "ctrlc.py"
    script.write_text(
        textwrap.dedent(f"""
        import asyncio, json, signal, sys
        # Ctrl-C as a terminal delivers it: a shell that starts a job in the background (`cmd &` without job
        # control: nohup runs, some CI runners) passes SIGINT on ignored; asyncio.run then installs no handler
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from kvbench.harness.client.backend import OpenAIBackend
        from kvbench.harness.client.scheduler import Concurrency, run_load
        from kvbench.harness.client.metrics import summarize

        def progress(done, total):
            print("progress", done, total, flush=True)

        lr = asyncio.run(run_load(OpenAIBackend({server.base_url!r}, "m"), [[1, 2]] * 200, 8, Concurrency(2),
                                  on_progress=progress))
        s = summarize(lr)
        print(json.dumps({{"interrupted": lr.interrupted, "completed": s.completed, "failed": s.failed,
                          "not_sent": s.not_sent, "reasons": s.failure_reasons}}), flush=True)
        sys.exit(130 if lr.interrupted else 0)
    """)
    )
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:  # wait until two requests have finished
            if line.startswith("progress ") and int(line.split()[1]) >= 2:  # counts may step by more than one
                break
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (out, err)
    res = json.loads(out.strip().splitlines()[-1])
    assert res["interrupted"] and res["completed"] >= 2
    assert res["not_sent"] > 0 and set(res["reasons"]) <= {"cancelled"}
    assert "Traceback" not in err and "Unclosed" not in err


def test_sweep_gives_one_result_per_point(server):
    seen = []
    points = run_sweep_sync(
        server.base_url,
        [Concurrency(1), Concurrency(4), Rate(100.0, seed=1)],
        on_progress=lambda k, d, t: seen.append(k),
    )
    assert [p.mode["kind"] for p in points] == ["concurrency", "concurrency", "rate"]
    assert [summarize(p).concurrency["max"] for p in points][:2] == [1, 4]
    assert all(summarize(p).completed == 6 for p in points)
    assert sorted(set(seen)) == [0, 1, 2]
    # Each point got its own prompts (no prefix-cache reuse across points).
    assert len({tuple(p.results[0].request_id.split("-")[1:2]) for p in points}) == 3


def run_sweep_sync(url, modes, **kw):
    def prompts(k, mode):
        return [[k + 10, i, 3, 4] for i in range(6)]

    return asyncio.run(run_sweep(OpenAIBackend(url, "kvbench-fake"), prompts, 4, modes, **kw))


def test_results_serialize_to_plain_json_and_back(server):
    server.configure(fail_every=4)
    lr = run(server.base_url)
    text = json.dumps(lr.as_dict(), allow_nan=False)
    back = LoadResult.from_dict(json.loads(text))
    assert back.results == lr.results
    assert summarize(back).as_dict() == summarize(lr).as_dict()


def test_warmup_is_kept_apart(server):
    lr = run(server.base_url, warmup_prompts=[[9, 9, 9]] * 3)
    assert len(lr.warmup) == 3 and len(lr.results) == 12
    assert summarize(lr).completed == 12


def test_fake_server_cli_serves_models_and_metrics(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvbench.testing.fakeserver", "--port", "0", "--ttft-ms", "1"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        url = proc.stdout.readline().split()[-1]
        import urllib.request

        models = json.loads(urllib.request.urlopen(url + "/v1/models", timeout=5).read())
        assert models["data"][0]["id"] == "kvbench-fake"
        s = summarize(run(url, prompts=P[:2]))
        assert s.completed == 2
        metrics = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
        assert 'vllm:generation_tokens_total{engine="0",model_name="kvbench-fake"} 16.0' in metrics
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)
