"""The two clients scripts/peer_vllm_bench_serve.py compares, each run once into a dict of the same metrics:
kvbench's load generator (`run_kvbench`) and `vllm bench serve` called as a library (`run_vllm_bench`: vLLM's
`add_cli_args` + `main`, in this process, its aiohttp session's trust_env off or as shipped). Both count the
garbage collector's pauses and the client thread's CPU and run-queue wait alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import io
import time

from kvbench.harness.client.clientsched import thread_cpu_and_wait_s


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


def run_kvbench(url: str, model: str, tokenizer, a, seed: int, schedule_seed: int | None = None) -> dict:
    """One kvbench run. seed: its prompts; schedule_seed: with --request-rate, the `--seed` of the vLLM run
    it is paired with, so both clients send on exactly the same Poisson schedule (their prompts differ, so
    the prefix cache cannot favour the second)."""
    from kvbench.harness.client.backend import OpenAIBackend
    from kvbench.harness.client.metrics import summarize
    from kvbench.harness.client.scheduler import Concurrency, Rate, run_load
    from kvbench.harness.client.workload import Workload, make_prompts

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


def vllm_argv(url: str, model: str, a, seed: int) -> list[str]:
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


def vllm_main(argv: list[str], trust_env: bool = True) -> dict:
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    with aiohttp_trust_env(trust_env):
        return main(parser.parse_args(argv))


def vllm_row(r: dict) -> dict:
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
        r = vllm_main(vllm_argv(url, model, a, seed), trust_env)
    after = thread_cpu_and_wait_s()
    row = {**gcp.summary(), **vllm_row(r)}
    if before and after:
        # Its whole call (dataset and tokenizer setup included): an upper bound on the run's own share.
        row["client_cpu_s_incl_setup"] = after[0] - before[0]
        row["client_runqueue_wait_s_incl_setup"] = after[1] - before[1]
    return row


# The vLLM clients: "vllm" is vllm bench serve with its aiohttp session's trust_env off (see
# aiohttp_trust_env), "vllm_as_shipped" exactly as shipped. The first of each list is the verdict's reference.
TRUST_ENV = {"vllm": False, "vllm_as_shipped": True}
VLLM_CLIENTS = {"both": ["vllm", "vllm_as_shipped"], "no-trust-env": ["vllm"], "as-shipped": ["vllm_as_shipped"]}
