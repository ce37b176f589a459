"""The fake server's settings and state: what it is told (FakeConfig) and what it keeps between requests.

kvbench.testing.fakeserver describes the server as a whole; this module, fakeroutes, fakestream and
fakeanswers are its parts.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, fields
from typing import Any

from aiohttp import web

READY = "KVBENCH_FAKESERVER_READY"


@dataclass
class FakeConfig:
    ttft_s: float = 0.0  # request arrival -> first chunk written
    itl_s: float = 0.0  # between chunk writes
    tokens_per_chunk: int = 1
    model: str = "kvbench-fake"
    max_model_len: int = 4096
    fail_every: int = 0  # every k-th request: HTTP 500
    hang_every: int = 0  # every k-th request: never finishes
    hang_after_chunks: int = 0  # chunks sent before hanging; 0: before the headers
    drop_every: int = 0  # every k-th request: connection closed mid-stream
    drop_after_chunks: int = 1
    usage: bool = True  # honour stream_options.include_usage
    continuous_usage: bool = True  # honour stream_options.continuous_usage_stats
    send_done: bool = True  # end with data: [DONE]
    # What it says it is: a KV dtype in vllm:cache_config_info (None: no such metric, like a non-vLLM server),
    # a vLLM version on /version (None: no /version), an API key /v1 paths require (None: open), as vLLM does.
    kv_cache_dtype: str | None = None
    block_size: int = 16
    num_gpu_blocks: int = 1024
    vllm_version: str | None = None
    api_key: str | None = None
    # Non-streaming completions (what lm-eval sends): "tokens" answers " tok" x max_tokens; "passkey" answers
    # kvbench's retrieval prompts (kvbench.specs.evaltasks) with the asked key, read from the prompt. With
    # corrupt_above > 0, a request that arrives while more than that many are in flight gets wrong digits:
    # a server that is right at rest and wrong only under load.
    answers: str = "tokens"
    corrupt_above: int = 0
    # The field's other failure modes, one each (harness/quality/failuremodes.py): wrong digits while a prefill-only
    # request (max_tokens 1, streamed) is in flight (mixed steps); wrong digits for a text prompt that extends the
    # last one-token text prompt (the prefix condition's pair: a prefix-cache hit); every k-th answer empty.
    corrupt_beside_prefill: bool = False
    corrupt_cached: bool = False
    degenerate_every: int = 0
    # Hostile servers: a 500's body echoes the request's headers (a misconfigured proxy does); every route but
    # /fake/* answers 307 to `redirect_to` + its path (a server moved, or one trying to collect credentials).
    echo_headers: bool = False
    redirect_to: str | None = None
    model_root: str | None = None  # /v1/models' root (None: the model id, as vLLM serving a hub id says)
    metrics_body: str | None = None  # /metrics answers exactly this text (a server that is not vLLM's)
    # Lying token-id answers (kvbench.testing.fakehostile.DAMAGE: NaN logprobs, a short prompt_logprobs, a 500
    # echoing the credentials ...); damage_only: "fidelity" (prompt_logprobs > 1) or "agreement" (= 1).
    damage: str | None = None
    damage_only: str | None = None

    def update(self, changes: dict[str, Any]) -> None:
        names = {f.name: f.type for f in fields(self)}
        for k, v in changes.items():
            if k not in names:
                raise ValueError(f"unknown fake-server setting {k!r}")
            setattr(self, k, v)
        if int(self.tokens_per_chunk) < 1:
            raise ValueError("tokens_per_chunk must be >= 1")
        from kvbench.testing.fakehostile import DAMAGE

        if self.damage is not None and self.damage not in DAMAGE:
            raise ValueError(f"unknown damage {self.damage!r}; choose from: {', '.join(DAMAGE)}")


def event(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class State:
    def __init__(self, config: FakeConfig):
        self.config = config
        self.arrivals = 0
        self.running = 0
        self.prefilling = 0  # streamed requests for one token in flight (prefill-only traffic)
        self.last_prefix: str | None = None  # the last one-token text prompt (what a prefix cache would hold)
        self.log: list[dict[str, Any]] = []
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.success_total = 0
        self.stopping = asyncio.Event()
        self.rendered: dict[tuple, bytes] = {}  # zero-compute response bodies by shape, id left as RID
        self.headers_seen: list[dict[str, str]] = []  # every request's path and headers (GET /fake/headers)

    def reset(self) -> None:
        self.arrivals = 0
        self.log = []
        self.rendered = {}
        self.headers_seen = []


STATE = web.AppKey("state", State)
RID = "@@kvbench-rid@@"  # where a rendered zero-compute body gets its response id


class OneWriteResponse(web.StreamResponse):
    """Holds the headers back until the body is written (as aiohttp's Response does), so that headers and
    body leave in one write; a plain StreamResponse sends its headers on prepare()."""

    _send_headers_immediately = False


def count_prompt_tokens(body: dict[str, Any], chat: bool) -> int:
    if chat:
        text = " ".join(str(m.get("content", "")) for m in body.get("messages", []))
        return len(text.split()) + 4  # a stand-in for a chat template; the fake has no tokenizer
    p = body.get("prompt", "")
    if isinstance(p, list) and all(isinstance(i, int) for i in p):
        return len(p)
    return len(str(p).split())


@dataclass
class Call:
    """One completion request as it arrived: what each way of answering it (failure, whole answer, stream) needs."""

    request: web.Request
    st: State
    cfg: FakeConfig  # a snapshot taken on arrival: a reconfigure mid-request does not change it
    body: dict[str, Any]
    chat: bool
    n: int  # arrival index, 1-based (faults are by arrival order)
    entry: dict[str, Any]  # its line in /fake/log
    t_recv: float  # perf_counter() on arrival
    max_tokens: int
    prompt_tokens: int
