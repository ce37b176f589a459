"""The fake server's completion endpoint: each request fails, is answered whole (fakeanswers), or is streamed.

A stream is written one of two ways: paced (each chunk at its deadline from the arrival, with the configured
hangs and drops) or, with zero compute, all at once, so that the client roofline measures the client.
"""

from __future__ import annotations

import asyncio
import copy
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from kvbench.testing.fakeanswers import complete_whole
from kvbench.testing.fakestate import RID, STATE, Call, OneWriteResponse, count_prompt_tokens, event


async def completion(request: web.Request) -> web.StreamResponse:
    """POST /v1/completions and /v1/chat/completions."""
    call = await _arrive(request)
    cfg = call.cfg
    if cfg.fail_every and call.n % cfg.fail_every == 0:
        return _fail(call)
    if not call.body.get("stream"):
        return await complete_whole(call)
    return await _stream(call)


async def _arrive(request: web.Request) -> Call:
    """The request counted and logged on arrival."""
    t_recv = time.perf_counter()
    st = request.app[STATE]
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
    prompt_tokens = count_prompt_tokens(body, chat)
    entry["max_tokens"] = max_tokens
    entry["prompt_tokens"] = prompt_tokens
    return Call(request, st, cfg, body, chat, n, entry, t_recv, max_tokens, prompt_tokens)


def _fail(call: Call) -> web.Response:
    """fail_every: an HTTP 500 shaped like vLLM's (echo_headers: with the request's headers, as a bad proxy)."""
    call.entry["outcome"] = "http_500"
    error = {"message": "fake failure", "type": "InternalServerError", "code": 500}
    if call.cfg.echo_headers:
        error["request_headers"] = dict(call.request.headers)
    return web.json_response({"error": error}, status=500)


@dataclass
class _Events:
    """One stream's SSE events, shaped like vLLM's."""

    chat: bool
    rid: str  # the response id written (RID in a zero-compute body rendered for reuse)
    model: str
    created: int
    prompt_tokens: int
    max_tokens: int
    sizes: list[int]  # tokens in each chunk
    with_usage: bool  # stream_options.include_usage, if the config honours it
    continuous: bool  # usage on every chunk (continuous_usage_stats)
    send_done: bool

    def usage(self, done: int) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + done,
            "completion_tokens": done,
        }

    def _head(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return {"id": self.rid, "object": obj, "created": self.created, "model": self.model, "choices": choices}

    def chunk(self, i: int, done: int, size: int) -> bytes:
        last = i == len(self.sizes) - 1
        text = " tok" * size
        choice: dict[str, Any] = {"index": 0, "finish_reason": "length" if last else None}
        if self.chat:
            choice["delta"] = {"content": text}
        else:
            choice["text"] = text
        ev = self._head([choice])
        if self.continuous:
            ev["usage"] = self.usage(done)
        return event(ev)

    def opener(self) -> bytes:
        """vLLM's chat stream opens with a role-only chunk, sent with the first token."""
        ev = self._head([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
        if self.continuous:
            ev["usage"] = self.usage(0)
        return event(ev)

    def tail(self) -> bytes:
        out = b""
        if self.with_usage:
            out += event({**self._head([]), "usage": self.usage(self.max_tokens)})
        if self.send_done:
            out += b"data: [DONE]\n\n"
        return out

    def whole(self) -> bytes:
        """Every event of the stream, in order."""
        done = 0
        parts = [self.opener()] if self.chat else []
        for i, size in enumerate(self.sizes):
            done += size
            parts.append(self.chunk(i, done, size))
        parts.append(self.tail())
        return b"".join(parts)


def _events(call: Call, rid: str) -> _Events:
    cfg, max_tokens = call.cfg, call.max_tokens
    opts = call.body.get("stream_options") or {}
    with_usage = cfg.usage and bool(opts.get("include_usage"))
    k = int(cfg.tokens_per_chunk)
    return _Events(
        chat=call.chat,
        rid=rid,
        model=cfg.model,
        created=int(time.time()),
        prompt_tokens=call.prompt_tokens,
        max_tokens=max_tokens,
        sizes=[k] * (max_tokens // k) + ([max_tokens % k] if max_tokens % k else []),
        with_usage=with_usage,
        continuous=with_usage and cfg.continuous_usage and bool(opts.get("continuous_usage_stats")),
        send_done=cfg.send_done,
    )


async def _stream(call: Call) -> web.StreamResponse:
    cfg, st, n = call.cfg, call.st, call.n
    hang = bool(cfg.hang_every and n % cfg.hang_every == 0)
    drop = bool(not hang and cfg.drop_every and n % cfg.drop_every == 0)
    if hang and cfg.hang_after_chunks <= 0:
        call.entry["outcome"] = "hang"
        await st.stopping.wait()
        raise web.HTTPServiceUnavailable()
    rid = f"{'chatcmpl' if call.chat else 'cmpl'}-fake-{n}"
    zero = cfg.ttft_s <= 0 and cfg.itl_s <= 0 and not hang and not drop
    events = _events(call, RID if zero else rid)  # a zero-compute body is rendered once per shape, its id set later
    headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    resp = OneWriteResponse(headers=headers) if zero else web.StreamResponse(headers=headers)
    await resp.prepare(call.request)
    st.running += 1
    prefill_only = call.max_tokens == 1
    st.prefilling += prefill_only
    st.prompt_tokens_total += call.prompt_tokens
    try:
        if zero:
            await _write_at_once(call, resp, events, rid)
        elif not await _write_paced(call, resp, events, hang, drop):
            return resp  # hung or dropped: never finishes
        await resp.write_eof()
        st.generation_tokens_total += call.max_tokens
        st.success_total += 1
        return resp
    finally:
        st.running -= 1
        st.prefilling -= prefill_only


async def _write_at_once(call: Call, resp: web.StreamResponse, events: _Events, rid: str) -> None:
    """Zero compute: headers, every event and the end in one write, so the roofline measures the client."""
    # Rendered once per shape (and second of `created`): JSON-encoding 17 events per request made
    # this fake, not the client, the bottleneck near 5,000 requests/s.
    st, ev = call.st, events
    k = int(call.cfg.tokens_per_chunk)
    key = (
        ev.chat,
        ev.max_tokens,
        k,
        ev.prompt_tokens,
        ev.with_usage,
        ev.continuous,
        ev.send_done,
        ev.model,
        ev.created,
    )
    body = st.rendered.get(key)
    if body is None:
        whole = ev.whole()
        if len(st.rendered) > 64:
            st.rendered.clear()
        body = st.rendered[key] = whole
    body = body.replace(RID.encode(), rid.encode())
    call.entry["writes_s"].append(time.perf_counter())
    await resp.write_eof(body)


async def _write_paced(call: Call, resp: web.StreamResponse, events: _Events, hang: bool, drop: bool) -> bool:
    """Each chunk at its deadline from the arrival (not cumulative sleeps, so lateness does not accumulate);
    False if the stream hung or was dropped on the way."""
    cfg, entry = call.cfg, call.entry
    done = 0
    for i, size in enumerate(events.sizes):
        delay = call.t_recv + cfg.ttft_s + i * cfg.itl_s - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if drop and i == cfg.drop_after_chunks:
            entry["outcome"] = "dropped"
            call.request.transport.close()  # mid-stream: the chunked body never terminates
            return False
        if hang and i == cfg.hang_after_chunks:
            entry["outcome"] = "hang"
            await call.st.stopping.wait()
            return False
        done += size
        data = (events.opener() if events.chat and i == 0 else b"") + events.chunk(i, done, size)
        entry["writes_s"].append(time.perf_counter())
        await resp.write(data)
    await resp.write(events.tail())
    return True
