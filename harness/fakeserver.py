"""A fake OpenAI-compatible streaming server with known timing, for truth checks and the client roofline.

It streams `max_tokens` tokens (ignore_eos semantics) as SSE chunks shaped like vLLM's: the first chunk
`ttft_s` after the request arrived, then one chunk every `itl_s`, each holding `tokens_per_chunk` tokens,
with `usage` on every chunk (continuous usage stats) and a final usage-only chunk, then `[DONE]`.
Chunk times are deadlines from the arrival (not cumulative sleeps), so lateness does not accumulate,
and every write is logged with its `perf_counter()` time taken just before the write, so no byte can reach
a client before its stamp (CLOCK_MONOTONIC is shared by processes on one host: a client can compare).

Faults by arrival order (1-based): every `fail_every`-th request gets HTTP 500, every `hang_every`-th
never finishes (after `hang_after_chunks` chunks; 0 = before the response headers), every
`drop_every`-th has its connection closed after `drop_after_chunks` chunks.

With `ttft_s == itl_s == 0` (zero-compute) the whole response is written at once: the client roofline
measures the client, not this server.

Requests without `"stream": true` get one JSON response (see FakeConfig.answers: it can answer kvbench's
retrieval prompts, and corrupt them above a concurrency).

Endpoints: POST /v1/completions, /v1/chat/completions; GET /v1/models, /health, /metrics (Prometheus text
with vLLM names); control: GET/POST /fake/config (POST replaces fields and resets counters and log),
GET /fake/log (?clear=1), GET /fake/headers (every request's headers: where a credential went).

In-process: `with FakeServer(FakeConfig(ttft_s=0.05)) as srv: srv.base_url` (its own thread and event
loop) or `FakeServer(..., mode="process")` (a subprocess: no shared GIL with the client). Standalone:
`python -m kvbench.harness.fakeserver --port 8000 --ttft-ms 50 --itl-ms 10 --tokens-per-chunk 4`.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, fields
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
    # kvbench's retrieval prompts (kvbench.evaltasks) with the asked key, read from the prompt. With
    # corrupt_above > 0, a request that arrives while more than that many are in flight gets wrong digits:
    # a server that is right at rest and wrong only under load.
    answers: str = "tokens"
    corrupt_above: int = 0
    # The field's other failure modes, one each (harness/failuremodes.py): wrong digits while a prefill-only
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

    def update(self, changes: dict[str, Any]) -> None:
        names = {f.name: f.type for f in fields(self)}
        for k, v in changes.items():
            if k not in names:
                raise ValueError(f"unknown fake-server setting {k!r}")
            setattr(self, k, v)
        if int(self.tokens_per_chunk) < 1:
            raise ValueError("tokens_per_chunk must be >= 1")


def _event(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class _State:
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
        self.rendered: dict[tuple, bytes] = {}  # zero-compute response bodies by shape, id left as _RID
        self.headers_seen: list[dict[str, str]] = []  # every request's path and headers (GET /fake/headers)

    def reset(self) -> None:
        self.arrivals = 0
        self.log = []
        self.rendered = {}
        self.headers_seen = []


STATE = web.AppKey("state", _State)
_RID = "@@kvbench-rid@@"  # where a rendered zero-compute body gets its response id


class _OneWriteResponse(web.StreamResponse):
    """Holds the headers back until the body is written (as aiohttp's Response does), so that headers and
    body leave in one write; a plain StreamResponse sends its headers on prepare()."""

    _send_headers_immediately = False


def _prompt_tokens(body: dict[str, Any], chat: bool) -> int:
    if chat:
        text = " ".join(str(m.get("content", "")) for m in body.get("messages", []))
        return len(text.split()) + 4  # a stand-in for a chat template; the fake has no tokenizer
    p = body.get("prompt", "")
    if isinstance(p, list) and all(isinstance(i, int) for i in p):
        return len(p)
    return len(str(p).split())


async def _completion(request: web.Request) -> web.StreamResponse:
    t_recv = time.perf_counter()
    st: _State = request.app[STATE]
    cfg = copy.copy(st.config)  # a snapshot: a reconfigure mid-request does not change it (all fields are scalars)
    chat = request.path.endswith("/chat/completions")
    body = await request.json()
    st.arrivals += 1
    n = st.arrivals
    entry: dict[str, Any] = {
        "n": n,
        "request_id": request.headers.get("X-Request-Id"),
        "received_s": t_recv,
        "api": "chat" if chat else "completions",
        "writes_s": [],
        "outcome": "ok",
    }
    st.log.append(entry)
    max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
    prompt_tokens = _prompt_tokens(body, chat)
    entry["max_tokens"] = max_tokens
    entry["prompt_tokens"] = prompt_tokens

    if cfg.fail_every and n % cfg.fail_every == 0:
        entry["outcome"] = "http_500"
        error = {"message": "fake failure", "type": "InternalServerError", "code": 500}
        if cfg.echo_headers:
            error["request_headers"] = dict(request.headers)
        return web.json_response({"error": error}, status=500)
    if not body.get("stream"):
        return await _complete_whole(request, st, cfg, body, chat, n, entry, t_recv)
    hang = bool(cfg.hang_every and n % cfg.hang_every == 0)
    drop = bool(not hang and cfg.drop_every and n % cfg.drop_every == 0)
    if hang and cfg.hang_after_chunks <= 0:
        entry["outcome"] = "hang"
        await st.stopping.wait()
        raise web.HTTPServiceUnavailable()

    opts = body.get("stream_options") or {}
    with_usage = cfg.usage and bool(opts.get("include_usage"))
    continuous = with_usage and cfg.continuous_usage and bool(opts.get("continuous_usage_stats"))
    k = int(cfg.tokens_per_chunk)
    sizes = [k] * (max_tokens // k) + ([max_tokens % k] if max_tokens % k else [])
    rid = f"{'chatcmpl' if chat else 'cmpl'}-fake-{n}"
    zero = cfg.ttft_s <= 0 and cfg.itl_s <= 0 and not hang and not drop
    rid_in = _RID if zero else rid  # a zero-compute body is rendered once per shape and gets its id below
    created = int(time.time())
    obj = "chat.completion.chunk" if chat else "text_completion"

    def usage(done: int) -> dict[str, int]:
        return {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + done, "completion_tokens": done}

    def chunk(i: int, done: int, size: int) -> bytes:
        last = i == len(sizes) - 1
        text = " tok" * size
        choice: dict[str, Any] = {"index": 0, "finish_reason": "length" if last else None}
        if chat:
            choice["delta"] = {"content": text}
        else:
            choice["text"] = text
        ev: dict[str, Any] = {"id": rid_in, "object": obj, "created": created, "model": cfg.model, "choices": [choice]}
        if continuous:
            ev["usage"] = usage(done)
        return _event(ev)

    def opener() -> bytes:  # vLLM's chat stream opens with a role-only chunk, sent with the first token
        ev: dict[str, Any] = {
            "id": rid_in,
            "object": obj,
            "created": created,
            "model": cfg.model,
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
        }
        if continuous:
            ev["usage"] = usage(0)
        return _event(ev)

    def tail() -> bytes:
        out = b""
        if with_usage:
            ev = {
                "id": rid_in,
                "object": obj,
                "created": created,
                "model": cfg.model,
                "choices": [],
                "usage": usage(max_tokens),
            }
            out += _event(ev)
        if cfg.send_done:
            out += b"data: [DONE]\n\n"
        return out

    headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    resp = _OneWriteResponse(headers=headers) if zero else web.StreamResponse(headers=headers)
    await resp.prepare(request)
    st.running += 1
    prefill_only = max_tokens == 1
    st.prefilling += prefill_only
    st.prompt_tokens_total += prompt_tokens
    try:
        if zero:  # zero-compute: headers, every event and the end in one write, so the roofline measures the client
            # Rendered once per shape (and second of `created`): JSON-encoding 17 events per request made
            # this fake, not the client, the bottleneck near 5,000 requests/s.
            key = (chat, max_tokens, k, prompt_tokens, with_usage, continuous, cfg.send_done, cfg.model, created)
            body = st.rendered.get(key)
            if body is None:
                done = 0
                parts = [opener()] if chat else []
                for i, size in enumerate(sizes):
                    done += size
                    parts.append(chunk(i, done, size))
                parts.append(tail())
                if len(st.rendered) > 64:
                    st.rendered.clear()
                body = st.rendered[key] = b"".join(parts)
            body = body.replace(_RID.encode(), rid.encode())
            entry["writes_s"].append(time.perf_counter())
            await resp.write_eof(body)
        else:
            done = 0
            for i, size in enumerate(sizes):
                delay = t_recv + cfg.ttft_s + i * cfg.itl_s - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                if drop and i == cfg.drop_after_chunks:
                    entry["outcome"] = "dropped"
                    request.transport.close()  # mid-stream: the chunked body never terminates
                    return resp
                if hang and i == cfg.hang_after_chunks:
                    entry["outcome"] = "hang"
                    await st.stopping.wait()
                    return resp
                done += size
                data = (opener() if chat and i == 0 else b"") + chunk(i, done, size)
                entry["writes_s"].append(time.perf_counter())
                await resp.write(data)
            await resp.write(tail())
        await resp.write_eof()
        st.generation_tokens_total += max_tokens
        st.success_total += 1
        return resp
    finally:
        st.running -= 1
        st.prefilling -= prefill_only


_NEEDLE = re.compile(r"The pass key (?:of (\S+) )?is (\d+)\.")
_QUESTION = re.compile(r"The pass key (?:of (\S+) )?is$")


def passkey_answer(prompt: str) -> str | None:
    """The key a kvbench retrieval prompt asks for (None for any other prompt)."""
    asked = _QUESTION.search(prompt.rstrip())
    if not asked:
        return None
    for name, key in _NEEDLE.findall(prompt):
        if (name or None) == asked.group(1):
            return key
    return None


def _answer(cfg: FakeConfig, prompt: str, max_tokens: int, corrupt: bool, n: int = 1) -> tuple[str, str]:
    """(text, finish_reason) of a non-streamed completion (the n-th request)."""
    if cfg.answers == "passkey":
        key = passkey_answer(prompt)
        if key is not None and cfg.degenerate_every and n % cfg.degenerate_every == 0:
            return "", "stop"
        if key is not None:
            if corrupt:  # every digit shifted: wrong, and the same wrong answer every time
                key = "".join(str((int(d) + 1) % 10) for d in key)
            return " " + key, "stop"
    return " tok" * max_tokens, "length"


def _token_completion(body: dict[str, Any], max_tokens: int, corrupt: bool, n: int) -> dict[str, Any]:
    """A token-id prompt (kvbench's agreement and canary requests) answered greedily and deterministically: the
    continuation's ids follow from the prompt's (shifted when `corrupt`), with vLLM's `logprobs` shape
    (`token_id:<n>` with return_tokens_as_token_ids) and, when asked, `prompt_logprobs`."""
    prompt = [int(t) for t in body["prompt"]]
    base = sum(prompt) % 997 + (1 if corrupt else 0)
    ids = [(base + 7 * i) % 1000 for i in range(max_tokens)]
    choice: dict[str, Any] = {"index": 0, "text": " tok" * len(ids), "finish_reason": "length", "logprobs": None}
    if body.get("logprobs") is not None:
        choice["logprobs"] = {"tokens": [f"token_id:{t}" for t in ids], "token_logprobs": [-0.5] * len(ids)}
    if body.get("prompt_logprobs") is not None:
        choice["prompt_logprobs"] = [None] + [{str(t): {"logprob": -0.5, "rank": 1}} for t in prompt[1:]]
    return {
        "id": f"cmpl-fake-{n}",
        "object": "text_completion",
        "model": body.get("model"),
        "choices": [choice],
        "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids), "total_tokens": len(prompt) + len(ids)},
    }


async def _complete_whole(
    request: web.Request,
    st: _State,
    cfg: FakeConfig,
    body: dict[str, Any],
    chat: bool,
    n: int,
    entry: dict[str, Any],
    t_recv: float,
) -> web.Response:
    """A non-streamed response after ttft_s + itl_s per further token; a list of prompts gets one choice each.
    hang_every / drop_every apply as to streams (a hung request never answers; a dropped one is cut off)."""
    if cfg.hang_every and n % cfg.hang_every == 0:
        entry["outcome"] = "hang"
        await st.stopping.wait()
        raise web.HTTPServiceUnavailable()
    if cfg.drop_every and n % cfg.drop_every == 0:
        entry["outcome"] = "dropped"
        request.transport.close()
        raise web.HTTPServiceUnavailable()
    max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
    corrupt = bool(cfg.corrupt_above and st.running >= cfg.corrupt_above)  # this request makes it one more
    corrupt |= bool(cfg.corrupt_beside_prefill and st.prefilling)
    ids_prompt = not chat and isinstance(body.get("prompt"), list) and all(isinstance(t, int) for t in body["prompt"])
    text = body.get("prompt") if not chat and isinstance(body.get("prompt"), str) else None
    if text is not None and max_tokens == 1:
        st.last_prefix = text
    elif text is not None and st.last_prefix and len(text) > len(st.last_prefix) and text.startswith(st.last_prefix):
        corrupt = corrupt or cfg.corrupt_cached  # it extends the cached prefix (used once: a tiny cache)
        st.last_prefix = None
    entry["in_flight_at_arrival"] = st.running
    entry["corrupted"] = corrupt
    st.running += 1
    try:
        delay = t_recv + cfg.ttft_s + max(0, max_tokens - 1) * cfg.itl_s - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
    finally:
        st.running -= 1
    if ids_prompt:
        return web.json_response(_token_completion(body, max_tokens, corrupt, n))
    if chat:
        prompts = [" ".join(str(m.get("content", "")) for m in body.get("messages", []))]
    else:
        raw = body.get("prompt", "")
        prompts = raw if isinstance(raw, list) and all(isinstance(p, str) for p in raw) else [raw]
    choices, completion_tokens = [], 0
    for i, prompt in enumerate(prompts):
        text, finish = _answer(cfg, prompt if isinstance(prompt, str) else "", max_tokens, corrupt, n)
        completion_tokens += len(text.split())
        choices.append(
            {"index": i, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
            if chat
            else {"index": i, "text": text, "logprobs": None, "finish_reason": finish}
        )
    prompt_tokens = _prompt_tokens(body, chat)
    st.prompt_tokens_total += prompt_tokens
    st.generation_tokens_total += completion_tokens
    st.success_total += 1
    entry["writes_s"].append(time.perf_counter())
    return web.json_response(
        {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-fake-{n}",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": cfg.model,
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
    )


async def _models(request: web.Request) -> web.Response:
    cfg: FakeConfig = request.app[STATE].config
    return web.json_response(
        {
            "object": "list",
            "data": [
                {
                    "id": cfg.model,
                    "object": "model",
                    "owned_by": "kvbench-fake",
                    "root": cfg.model if cfg.model_root is None else cfg.model_root,
                    "max_model_len": cfg.max_model_len,
                }
            ],
        }
    )


async def _metrics(request: web.Request) -> web.Response:
    st: _State = request.app[STATE]
    if st.config.metrics_body is not None:
        return web.Response(text=st.config.metrics_body, content_type="text/plain")
    lab = f'{{engine="0",model_name="{st.config.model}"}}'
    lines = [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{lab} {float(st.running)}",
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{lab} 0.0",
        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
        "# TYPE vllm:kv_cache_usage_perc gauge",
        f"vllm:kv_cache_usage_perc{lab} 0.0",
        "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.",
        "# TYPE vllm:prompt_tokens_total counter",
        f"vllm:prompt_tokens_total{lab} {float(st.prompt_tokens_total)}",
        "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
        "# TYPE vllm:generation_tokens_total counter",
        f"vllm:generation_tokens_total{lab} {float(st.generation_tokens_total)}",
        "# HELP vllm:request_success_total Count of successfully processed requests.",
        "# TYPE vllm:request_success_total counter",
        (
            f'vllm:request_success_total{{engine="0",finished_reason="length",model_name="{st.config.model}"}} '
            f"{float(st.success_total)}"
        ),
    ]
    cfg = st.config
    if cfg.kv_cache_dtype is not None:
        tokens = cfg.num_gpu_blocks * cfg.block_size
        lines += [
            "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
            "# TYPE vllm:cache_config_info gauge",
            f'vllm:cache_config_info{{block_size="{cfg.block_size}",cache_dtype="{cfg.kv_cache_dtype}",engine="0",'
            f'kv_cache_size_tokens="{tokens}",num_gpu_blocks="{cfg.num_gpu_blocks}"}} 1.0',
        ]
    return web.Response(text="\n".join(lines) + "\n", content_type="text/plain", charset="utf-8")


async def _version(request: web.Request) -> web.Response:
    cfg: FakeConfig = request.app[STATE].config
    if cfg.vllm_version is None:
        raise web.HTTPNotFound()
    return web.json_response({"version": cfg.vllm_version})


@web.middleware
async def _seen(request: web.Request, handler):
    """Every request's headers are kept (GET /fake/headers), and `redirect_to` answers before anything else."""
    if request.path.startswith("/fake/"):
        return await handler(request)
    st: _State = request.app[STATE]
    st.headers_seen.append({"path": request.path, **request.headers})
    if st.config.redirect_to:
        raise web.HTTPTemporaryRedirect(st.config.redirect_to.rstrip("/") + request.path_qs)
    return await handler(request)


@web.middleware
async def _auth(request: web.Request, handler):
    """vLLM's --api-key: /v1 paths need `Authorization: Bearer <key>` (vllm/entrypoints/serve/middleware)."""
    key = request.app[STATE].config.api_key
    if key is not None and request.path.startswith("/v1") and request.headers.get("Authorization") != f"Bearer {key}":
        return web.json_response({"error": "Unauthorized"}, status=401)
    return await handler(request)


async def _health(request: web.Request) -> web.Response:
    return web.Response(text="")


async def _config(request: web.Request) -> web.Response:
    st: _State = request.app[STATE]
    if request.method == "POST":
        try:
            st.config.update(await request.json())
        except (ValueError, TypeError) as e:
            return web.json_response({"error": str(e)}, status=400)
        st.reset()
    return web.json_response(asdict(st.config))


async def _log(request: web.Request) -> web.Response:
    st: _State = request.app[STATE]
    out = web.json_response(st.log)
    if request.query.get("clear"):
        st.reset()
    return out


async def _headers_seen(request: web.Request) -> web.Response:
    return web.json_response(request.app[STATE].headers_seen)


def make_app(config: FakeConfig | None = None) -> web.Application:
    app = web.Application(middlewares=[_seen, _auth])
    app[STATE] = _State(config or FakeConfig())
    app.router.add_post("/v1/completions", _completion)
    app.router.add_post("/v1/chat/completions", _completion)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/health", _health)
    app.router.add_get("/version", _version)
    app.router.add_route("*", "/fake/config", _config)
    app.router.add_get("/fake/log", _log)
    app.router.add_get("/fake/headers", _headers_seen)
    return app


async def _serve(app: web.Application, sock: socket.socket) -> web.AppRunner:
    # handler_cancellation: a client that gives up on a hung request frees its handler.
    runner = web.AppRunner(app, handle_signals=False, access_log=None, handler_cancellation=True, shutdown_timeout=0.5)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    return runner


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.setblocking(False)
    return sock


class FakeServer:
    """The fake server, in a background thread (mode="thread") or a subprocess (mode="process")."""

    def __init__(
        self,
        config: FakeConfig | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        mode: str = "thread",
        uvloop: bool = False,
    ):
        if mode not in ("thread", "process"):
            raise ValueError("mode must be 'thread' or 'process'")
        self.config = config or FakeConfig()
        self.host = host
        self.port = port
        self.mode = mode
        self.uvloop = uvloop  # process mode only
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._app: web.Application | None = None
        self._proc: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> FakeServer:
        if self.mode == "thread":
            self._start_thread()
        else:
            self._start_process()
        return self

    def _start_thread(self) -> None:
        sock = _bind(self.host, self.port)
        self.port = sock.getsockname()[1]
        ready = threading.Event()
        errors: list[BaseException] = []

        def main():
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            try:
                self._app = make_app(self.config)
                self._runner = loop.run_until_complete(_serve(self._app, sock))
            except BaseException as e:  # reported to the starting thread
                errors.append(e)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=main, name="kvbench-fakeserver", daemon=True)
        self._thread.start()
        ready.wait(30)
        if errors:
            raise errors[0]

    def _start_process(self) -> None:
        cmd = [
            sys.executable,
            "-m",
            "kvbench.harness.fakeserver",
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--config-json",
            json.dumps(asdict(self.config)),
        ]
        cmd += ["--uvloop", "auto" if self.uvloop else "no"]
        self._proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True
        )
        line = self._proc.stdout.readline()  # the child prints its URL once it listens
        if not line.startswith(READY):
            self.stop()
            raise RuntimeError(f"fake server did not start (got {line!r})")
        self.port = int(line.rsplit(":", 1)[1])

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            loop, app = self._loop, self._app

            def shutdown():
                if app is not None:
                    app[STATE].stopping.set()  # release hung handlers
                loop.call_later(0.05, loop.stop)

            loop.call_soon_threadsafe(shutdown)
            self._thread.join(10)
            self._thread = self._loop = None
        if self._proc is not None:
            if self._proc.poll() is None:
                try:
                    os.killpg(self._proc.pid, signal.SIGTERM)
                    self._proc.wait(5)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    try:
                        os.killpg(self._proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    self._proc.wait(5)
            if self._proc.stdout:
                self._proc.stdout.close()
            self._proc = None

    def __enter__(self) -> FakeServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- control over HTTP (the same for both modes) ---------------------------------------------

    def _call(self, path: str, data: dict | None = None) -> Any:
        req = urllib.request.Request(self.base_url + path, method="POST" if data is not None else "GET")
        body = None
        if data is not None:
            body = json.dumps(data).encode()
            req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, body, timeout=10) as resp:
            return json.loads(resp.read())

    def configure(self, **changes: Any) -> dict[str, Any]:
        """Change settings (and reset the arrival counter and log) on the running server."""
        return self._call("/fake/config", changes)

    def headers_seen(self) -> list[dict[str, str]]:
        """Every request's path and headers since the last configure()."""
        return self._call("/fake/headers")

    def log(self, clear: bool = False) -> list[dict[str, Any]]:
        """Per request: arrival index, received_s and writes_s (perf_counter), outcome."""
        return self._call("/fake/log" + ("?clear=1" if clear else ""))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m kvbench.harness.fakeserver", description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="0: any free port (printed on stdout)")
    ap.add_argument("--ttft-ms", type=float, default=0.0)
    ap.add_argument("--itl-ms", type=float, default=0.0, help="delay between chunks")
    ap.add_argument("--tokens-per-chunk", type=int, default=1)
    ap.add_argument("--model", default="kvbench-fake")
    ap.add_argument("--fail-every", type=int, default=0)
    ap.add_argument("--hang-every", type=int, default=0)
    ap.add_argument("--hang-after-chunks", type=int, default=0)
    ap.add_argument("--drop-every", type=int, default=0)
    ap.add_argument("--drop-after-chunks", type=int, default=1)
    ap.add_argument("--no-usage", action="store_true")
    ap.add_argument("--no-continuous-usage", action="store_true")
    ap.add_argument("--config-json", help="a full FakeConfig as JSON (overrides the flags)")
    # Off by default: libuv's loop clock has millisecond granularity and its timers can fire up to 1 ms
    # early, which would break the guarantee that no chunk leaves before its configured time.
    ap.add_argument(
        "--uvloop", choices=["auto", "yes", "no"], default="no", help="serve on uvloop (auto: if installed)"
    )
    a = ap.parse_args(argv)
    if a.config_json:
        cfg = FakeConfig(**json.loads(a.config_json))
    else:
        cfg = FakeConfig(
            ttft_s=a.ttft_ms / 1e3,
            itl_s=a.itl_ms / 1e3,
            tokens_per_chunk=a.tokens_per_chunk,
            model=a.model,
            fail_every=a.fail_every,
            hang_every=a.hang_every,
            hang_after_chunks=a.hang_after_chunks,
            drop_every=a.drop_every,
            drop_after_chunks=a.drop_after_chunks,
            usage=not a.no_usage,
            continuous_usage=not a.no_continuous_usage,
        )
    if a.uvloop != "no":
        try:
            import uvloop

            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        except ImportError:
            if a.uvloop == "yes":
                raise
    asyncio.run(_main(cfg, a.host, a.port))


async def _main(cfg: FakeConfig, host: str, port: int) -> None:
    sock = _bind(host, port)
    app = make_app(cfg)
    runner = await _serve(app, sock)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"{READY} http://{host}:{sock.getsockname()[1]}", flush=True)
    await stop.wait()
    app[STATE].stopping.set()
    await runner.cleanup()


if __name__ == "__main__":
    main()
