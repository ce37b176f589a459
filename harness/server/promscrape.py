"""vLLM's Prometheus `/metrics`: cache configuration, KV usage, queue depth, preemptions.

Names are vLLM V1's (vllm/v1/metrics/loggers.py): `vllm:cache_config_info` is an info gauge whose labels
are every CacheConfig field (num_gpu_blocks, block_size, cache_dtype, kv_cache_size_tokens, ...).
The removed `vllm:gpu_cache_usage_perc` is read as a fallback for older servers.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from kvbench.core.logparse import EngineCapacity
from kvbench.harness.client import http

GAUGES = {
    "vllm:kv_cache_usage_perc": "kv_cache_usage",  # 0-1
    "vllm:gpu_cache_usage_perc": "kv_cache_usage",  # pre-V1 name
    "vllm:num_requests_running": "requests_running",
    "vllm:num_requests_waiting": "requests_waiting",
    "vllm:num_preemptions": "preemptions",  # counter family name; sample is *_total
    "vllm:prompt_tokens": "prompt_tokens",
    "vllm:generation_tokens": "generation_tokens",
    # the prefix cache, in tokens (counters): queried and found computed already
    "vllm:prefix_cache_queries": "prefix_cache_queries",
    "vllm:prefix_cache_hits": "prefix_cache_hits",
}


@dataclass
class MetricsSnapshot:
    t: float  # time.perf_counter() when scraped, on the same clock as request timings
    values: dict[str, float] = field(default_factory=dict)
    cache_config: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"t": self.t, "values": self.values, "cache_config": self.cache_config}


def parse_metrics(text: str, t: float | None = None) -> MetricsSnapshot:
    snap = MetricsSnapshot(t=time.perf_counter() if t is None else t)
    for family in text_string_to_metric_families(text):
        if family.name == "vllm:cache_config_info":
            for sample in family.samples:
                snap.cache_config = dict(sample.labels)
            continue
        for sample in family.samples:
            # Counters appear as `x_total` under family `x` or `x_total`, depending on the TYPE line.
            key = GAUGES.get(sample.name.removesuffix("_total"))
            if key is None:
                continue
            # Summed over engines/models: one server, one number.
            snap.values[key] = snap.values.get(key, 0.0) + float(sample.value)
    return snap


def fetch_metrics_text(
    base_url: str, timeout_s: float = 5.0, headers: dict[str, str] | None = None
) -> tuple[float, str]:
    """(perf_counter() when the answer arrived, the /metrics text), unparsed."""
    status, body = http.get(f"{base_url}/metrics", headers, timeout_s)
    if status != 200:
        raise OSError(f"{base_url}/metrics answered HTTP {status}")
    return time.perf_counter(), body.decode("utf-8", "replace")


def fetch_metrics(base_url: str, timeout_s: float = 5.0, headers: dict[str, str] | None = None) -> MetricsSnapshot:
    t, text = fetch_metrics_text(base_url, timeout_s, headers)
    return parse_metrics(text, t)


def metrics_or_note(base_url: str, headers: dict[str, str] | None, notes: list[str]) -> MetricsSnapshot:
    """/metrics now, or an empty snapshot and a note in `notes` when it does not answer as Prometheus text
    (a server without vLLM's metrics loses its capacity and counters, never its measurement)."""
    try:
        return fetch_metrics(base_url, 5.0, headers)
    except Exception as exc:  # OSError, HTTP errors, prometheus_client's ValueError/IndexError on other text
        note = f"/metrics unusable ({type(exc).__name__}): capacity and server counters unknown"
        if note not in notes:
            notes.append(note)
        return MetricsSnapshot(t=time.perf_counter())


def capacity_from_metrics(snap: MetricsSnapshot) -> EngineCapacity | None:
    """The engine's capacity as `/metrics` states it (for --endpoint runs, where there is no log)."""
    cc = snap.cache_config
    if not cc:
        return None

    def num(key: str, kind=int):
        try:
            return kind(float(cc[key])) if cc.get(key) not in (None, "None", "") else None
        except ValueError:
            return None

    blocks, block_size = num("num_gpu_blocks"), num("block_size")
    tokens = num("kv_cache_size_tokens") or (blocks * block_size if blocks and block_size else None)
    if tokens is None:
        return None
    mem = num("kv_cache_memory_bytes")
    return EngineCapacity(
        device=None,
        kv_tokens=tokens,
        max_concurrency=num("kv_cache_max_concurrency", float),
        tokens_per_request=None,
        source="metrics",
        kv_cache_gib=mem / 2**30 if mem else None,
        num_blocks=blocks,
        block_size=block_size,
        cache_dtype=cc.get("cache_dtype"),
    )


class MetricsSampler:
    """Scrapes /metrics every `interval_s` while load runs, so KV usage and queues line up with requests.

    Only the HTTP fetch happens during the load (in a thread: socket reads release the GIL); the text is
    parsed in `stop()`. Parsing vLLM's /metrics (hundreds of histogram buckets) in pure Python holds the GIL
    for a few hundred ms on a small CPU, and during the load that stalled the client's event loop: requests
    read 240-300 ms TTFT outliers at every scrape on the 2-core box, at any concurrency."""

    def __init__(self, base_url: str, interval_s: float = 1.0, headers: dict[str, str] | None = None):
        self.base_url = base_url
        self.headers = headers
        self.interval_s = interval_s
        self.samples: list[MetricsSnapshot] = []
        self.errors = 0
        self._raw: list[tuple[float, str]] = []
        self._task: asyncio.Task | None = None

    async def _loop(self) -> None:
        while True:
            try:
                self._raw.append(await asyncio.to_thread(fetch_metrics_text, self.base_url, 2.0, self.headers))
            except Exception:  # a busy or dying server; counted, never fatal
                self.errors += 1
            await asyncio.sleep(self.interval_s)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        for t, text in self._raw:  # after the load: parsing costs nothing measured now
            try:
                self.samples.append(parse_metrics(text, t))
            except Exception:  # a truncated scrape of a dying server
                self.errors += 1
        self._raw = []
