"""Talking to the server: one streaming request to an OpenAI-compatible endpoint, timed on the client.

Clock: `time.perf_counter()` (CLOCK_MONOTONIC on Linux) for every duration. Times in a `RequestResult`
are seconds: `intended_send_s` and `sent_s` from the run's origin (`LoadResult.started_at_monotonic`),
everything else from this request's own `sent_s`.

Timestamps are taken when a read from the socket returns, before parsing, once per read: events that
arrived in the same read share it (they reached the client together). This is the earliest moment the
client can know of a chunk; the parse cost lands after it, not in it.

Token counts come from the server's `usage` only. With `continuous_usage_stats` (vLLM sends it) every
chunk carries the running completion count, so the tokens per chunk are known exactly even when a chunk
holds several tokens or a token whose text is empty (an incomplete UTF-8 byte). Without usage the counts
stay None: unknown, never guessed from chunk counts.

One `aiohttp.ClientSession` serves a whole run, with a connector limit at least the run's concurrency, so
connections are reused (keep-alive) and TCP setup does not land in later requests' TTFT. (aiohttp's default
limit of 100 would silently cap a higher concurrency.)
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import aiohttp
import msgspec
import yarl
from msgspec import UNSET

from kvbench.core.scrub import excerpt
from kvbench.harness.client import http
from kvbench.harness.client.workload import Prompt

# A stable, short category per failure; `error` holds the detail.
ERROR_KINDS = (
    "http",  # non-200 status
    "connect",  # could not connect
    "disconnect",  # connection lost mid-request
    "truncated",  # stream ended without [DONE], or without any content chunk
    "timeout",  # request_timeout_s elapsed
    "server_error",  # an error event inside the stream
    "protocol",  # unparseable event
    "no_progress",  # cancelled by the scheduler's no-progress timeout
    "cancelled",  # cancelled (Ctrl-C or the caller)
    "client",  # anything else raised in the client
)


@dataclass
class RequestResult:
    """One request as the client saw it. Seconds throughout; plain JSON via `as_dict()`.

    Latency fields are None when not reached. A failed request keeps what was measured before it failed,
    but metrics exclude it from latency statistics.
    """

    index: int
    request_id: str | None = None  # sent as X-Request-Id (vLLM uses it as its request id: joins with server logs)
    requested_output_tokens: int = 0
    expected_prompt_tokens: int | None = None  # what the prompt was built to be (None: unknown)
    intended_send_s: float | None = None  # when the scheduler meant to send it, from the run origin
    sent_s: float | None = None  # when the POST was issued, from the run origin
    response_s: float | None = None  # HTTP status line and headers received, after sent_s
    first_chunk_s: float | None = None  # first event with non-empty `choices` (vLLM's TTFT), after sent_s
    ttft_s: float | None = None  # first chunk that carries output tokens, after sent_s
    e2e_s: float | None = None  # last chunk that carries output tokens, after sent_s (vLLM's E2EL)
    end_s: float | None = None  # stream finished ([DONE]) or failed, after sent_s
    chunk_arrivals_s: list[float] = field(default_factory=list)  # every token-carrying chunk, after sent_s
    chunk_tokens: list[int | None] = field(default_factory=list)  # tokens in each such chunk (None: unknown)
    prompt_tokens: int | None = None  # server usage.prompt_tokens
    completion_tokens: int | None = None  # server usage.completion_tokens
    # prompt tokens the server found in its prefix cache (usage.prompt_tokens_details.cached_tokens; vLLM
    # reports it with --enable-prompt-tokens-details; None: not reported)
    cached_tokens: int | None = None
    finish_reason: str | None = None
    ok: bool = False
    error_kind: str | None = None
    error: str | None = None
    http_status: int | None = None

    @property
    def schedule_lag_s(self) -> float | None:
        """Actual minus intended send time: client-side delay (coordinated omission shows up here)."""
        if self.sent_s is None or self.intended_send_s is None:
            return None
        return self.sent_s - self.intended_send_s

    @property
    def tokens_known(self) -> bool:
        """Every token-carrying chunk's token count is known (from continuous usage stats)."""
        return bool(self.chunk_tokens) and all(t is not None for t in self.chunk_tokens)

    def fail(self, kind: str, message: str) -> None:
        """Mark failed, keeping the first reason (a later cancel does not overwrite an HTTP 500)."""
        self.ok = False
        if self.error_kind is None:
            self.error_kind = kind
            self.error = message

    @property
    def failure_label(self) -> str | None:
        """Short reason used to group failures: 'HTTP 500', 'no progress for 5 s', 'timeout', ..."""
        if self.ok or self.error_kind is None:
            return None
        if self.error_kind == "http":
            return f"HTTP {self.http_status}"
        if self.error_kind == "no_progress":
            return self.error
        return self.error_kind

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["schedule_lag_s"] = self.schedule_lag_s
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RequestResult:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


# One streamed event, decoded straight into the few fields read here (msgspec skips the rest without
# building dicts: several times faster than json.loads, which was the client's largest single cost).
# Types are loose (Any) so that a well-formed event never fails validation for a field's type; `error`
# and `role` default to UNSET because their presence, not their value, is what counts.


class _Delta(msgspec.Struct):
    content: Any = None
    reasoning_content: Any = None
    role: Any = UNSET


class _Choice(msgspec.Struct):
    text: Any = None
    delta: _Delta | None = None
    finish_reason: Any = None


class _Event(msgspec.Struct):
    choices: list[_Choice] | None = None
    usage: dict[str, Any] | None = None
    error: Any = UNSET


_EVENT = msgspec.json.Decoder(_Event)
_DONE = b"[DONE]"


def _decode_event(payload: bytes | str) -> _Event | str | None:
    """An SSE data payload as an _Event; None for valid JSON that is not an object (skipped); a message
    (str) for one that is not JSON or not shaped like an event (a protocol error)."""
    try:
        return _EVENT.decode(payload)
    except msgspec.MsgspecError:
        return _decode_event_slowly(payload)


def _decode_event_slowly(payload: bytes | str) -> _Event | str | None:
    """What msgspec refused, through json.loads, the reference (it also takes NaN, Infinity, ...)."""
    if isinstance(payload, bytes):
        payload = payload.decode("utf-8", errors="replace")
    try:
        obj = json.loads(payload)
    except (json.JSONDecodeError, RecursionError):
        return f"unparseable event: {payload[:200]}"
    if not isinstance(obj, dict):
        return None
    try:
        return msgspec.convert(obj, _Event)
    except msgspec.MsgspecError as e:
        return f"unexpected event ({e}): {payload[:200]}"


_JSON_HEADERS = {"Content-Type": "application/json"}
_ENCODER = msgspec.json.Encoder()


def _encode(body: dict[str, Any]) -> bytes:
    """The request body as JSON, encoded before the send is stamped (aiohttp's json= would encode it with
    json.dumps inside the timed call). json.dumps for what msgspec cannot encode (an exotic extra_body)."""
    try:
        return _ENCODER.encode(body)
    except (TypeError, msgspec.MsgspecError):
        return json.dumps(body).encode()


class _SSE:
    """Incremental Server-Sent-Events splitter: bytes in, complete `data:` payloads out."""

    def __init__(self):
        self.buf = b""

    def payloads(self, data: bytes) -> list[bytes]:
        """The data payloads of the events completed by `data` (bytes; a multi-line event's lines joined)."""
        buf = self.buf + data if self.buf else data
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        # One split per read (a read often holds many events): cutting events off the front one at a
        # time would copy the rest of the buffer once per event.
        events = buf.split(b"\n\n")
        self.buf = events.pop()
        if buf.count(b"\n") == 2 * len(events):  # the usual read: every event is one line
            return [ev[5:].lstrip() for ev in events if ev.startswith(b"data:")]
        out = []
        for event in events:
            lines = [ln[5:].lstrip() for ln in event.split(b"\n") if ln.startswith(b"data:")]
            if lines:  # comment-only events (": ping") carry no data
                out.append(b"\n".join(lines))
        return out

    def feed(self, data: bytes) -> list[str]:
        """`payloads`, as text."""
        return [p.decode("utf-8", errors="replace") for p in self.payloads(data)]

    @property
    def pending(self) -> bool:
        return bool(self.buf.strip())


class OpenAIBackend:
    """Streaming client for `/v1/completions` or `/v1/chat/completions` of one model.

    Use as `async with OpenAIBackend(...) as backend:` or let `run_load` open and close it. Requests ask for
    exactly `output_tokens` (`ignore_eos`), greedy (`temperature` 0), streamed with usage on every chunk.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api: str = "completions",
        request_timeout_s: float = 600.0,
        *,
        max_connections: int | None = None,
        headers: dict[str, str] | None = None,
        extra_body: dict[str, Any] | None = None,
        ignore_eos: bool = True,
        temperature: float = 0.0,
        require_done: bool = True,
    ):
        if api not in ("completions", "chat"):
            raise ValueError(f"api must be 'completions' or 'chat', got {api!r}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api = api
        self.request_timeout_s = float(request_timeout_s)
        self.max_connections = max_connections
        self.headers = dict(headers or {})
        self.extra_body = dict(extra_body or {})
        self.ignore_eos = ignore_eos
        self.temperature = temperature
        self.require_done = require_done  # vLLM always ends with [DONE]; its absence means a cut stream
        self.url = f"{self.base_url}/v1/completions" if api == "completions" else f"{self.base_url}/v1/chat/completions"
        self._url = yarl.URL(self.url)  # parsed once, not per request
        self._session: aiohttp.ClientSession | None = None
        self._limit: int | None = None

    # -- session -----------------------------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        return self._session is not None and not self._session.closed

    async def open(self, max_connections: int | None = None) -> None:
        """Open the shared session. max_connections: connector limit (0 or None: unlimited)."""
        limit = max_connections if max_connections is not None else self.max_connections
        limit = int(limit or 0)
        if self.is_open:
            if self._limit == 0 or (limit and self._limit >= limit):
                return
            await self.close()  # too small a pool would queue requests inside aiohttp, unseen
        connector = aiohttp.TCPConnector(
            limit=limit, limit_per_host=limit, keepalive_timeout=60, enable_cleanup_closed=True
        )
        self._session = aiohttp.ClientSession(
            connector=connector, headers=self.headers, timeout=aiohttp.ClientTimeout(total=None)
        )
        self._limit = limit

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
        self._session = None
        self._limit = None

    async def __aenter__(self) -> OpenAIBackend:
        await self.open()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # -- requests ----------------------------------------------------------------------------------

    def payload(self, prompt: Prompt, output_tokens: int) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": int(output_tokens),
            "temperature": self.temperature,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
        if self.ignore_eos:
            body["ignore_eos"] = True
        if self.api == "completions":
            body["prompt"] = prompt.content
        else:
            if not isinstance(prompt.content, str):
                raise ValueError("chat requests need text prompts (token ids cannot be sent to /v1/chat/completions)")
            # A multi-turn prompt carries the whole conversation; otherwise the text is one user message.
            messages = prompt.messages or ({"role": "user", "content": prompt.content},)
            body["messages"] = list(messages)
        body.update(self.extra_body)
        return body

    async def send(
        self,
        prompt: Prompt | Sequence[int] | str,
        output_tokens: int,
        *,
        result: RequestResult | None = None,
        origin_s: float | None = None,
        on_progress: Callable[[], None] | None = None,
        request_id: str | None = None,
        before_send: Callable[[], Awaitable[Any]] | None = None,
    ) -> RequestResult:
        """Send one request and stream it to the end. Never raises for server or network failures: they
        are recorded in the result. A cancellation is recorded (error_kind 'cancelled', unless the caller
        already set a reason) and re-raised.

        result: a RequestResult to fill in place (the scheduler pre-creates it to keep partial data when it
            cancels the request); origin_s: perf_counter() of the run start, for `sent_s`;
        on_progress: called whenever bytes arrive (the scheduler's no-progress watchdog);
        before_send: awaited once the request is built, right before it is stamped and sent (the scheduler
            waits there for an open-loop request's send time, so the building is not in its lag).
        """
        if not self.is_open:
            await self.open()
        prompt = Prompt.of(prompt)
        r = result if result is not None else RequestResult(index=0)
        r.requested_output_tokens = int(output_tokens)
        if r.expected_prompt_tokens is None:
            r.expected_prompt_tokens = prompt.num_tokens
        body = _encode(self.payload(prompt, output_tokens))
        request_id = request_id or r.request_id
        r.request_id = request_id
        headers = {"Content-Type": "application/json", "X-Request-Id": request_id} if request_id else _JSON_HEADERS
        if before_send is not None:
            try:
                await before_send()
            except asyncio.CancelledError:
                r.fail("cancelled", "cancelled before it was sent")
                raise
        clock = time.perf_counter
        st = clock()
        r.sent_s = st - (origin_s if origin_s is not None else st)
        try:
            async with asyncio.timeout(self.request_timeout_s):
                # A redirect is not followed: it would carry the key (and every --header) to wherever it points.
                async with self._session.post(self._url, data=body, headers=headers, allow_redirects=False) as resp:
                    r.response_s = clock() - st
                    r.http_status = resp.status
                    if on_progress:
                        on_progress()
                    if resp.status != 200:
                        r.fail("http", await http.error_text(resp))
                    else:
                        await self._read_stream(resp, r, st, on_progress)
        except asyncio.CancelledError:
            r.fail("cancelled", "cancelled")
            r.end_s = clock() - st
            raise
        except TimeoutError:
            r.fail("timeout", f"no complete response within {self.request_timeout_s:g} s")
        except aiohttp.ClientConnectorError as e:
            r.fail("connect", f"cannot connect: {e}"[:300])
        except (
            aiohttp.ServerDisconnectedError,
            aiohttp.ClientPayloadError,
            aiohttp.ClientOSError,
            ConnectionError,
        ) as e:
            r.fail("disconnect", f"connection lost: {type(e).__name__}: {e}"[:300])
        except aiohttp.ClientError as e:
            r.fail("client", f"{type(e).__name__}: {e}"[:300])
        if r.end_s is None:
            r.end_s = clock() - st
        return r

    async def _read_stream(self, resp: aiohttp.ClientResponse, r: RequestResult, st: float, on_progress) -> None:
        clock = time.perf_counter
        decode = _EVENT.decode
        sse = _SSE()
        done = False
        last_ct = 0  # running completion_tokens from continuous usage
        usage_final = None
        usage_last = None
        arrivals, chunk_tokens = r.chunk_arrivals_s, r.chunk_tokens
        async for data in resp.content.iter_any():
            now = clock()  # one stamp per read, before any parsing
            if on_progress:
                on_progress()
            t = now - st
            for payload in sse.payloads(data):
                try:
                    event = decode(payload)
                except msgspec.MsgspecError:
                    if payload == _DONE:
                        done = True
                        continue
                    event = _decode_event_slowly(payload)
                    if event is None:
                        continue  # valid JSON, not an object: no data for us
                    if isinstance(event, str):
                        r.fail("protocol", event)
                        return
                choices = event.choices
                if event.error is not UNSET and not choices:
                    err = event.error
                    msg = err.get("message", err) if isinstance(err, dict) else err
                    r.fail("server_error", excerpt(f"error event: {msg}"))
                    return
                usage = event.usage
                if not choices:
                    if usage:
                        usage_final = usage  # the usage-only summary chunk
                    continue
                if r.first_chunk_s is None:
                    r.first_chunk_s = t
                choice = choices[0]
                if choice.finish_reason:
                    r.finish_reason = choice.finish_reason
                tokens = None
                if usage and (ct := usage.get("completion_tokens")) is not None:
                    usage_last = usage
                    ct = int(ct)
                    tokens = ct - last_ct
                    last_ct = ct
                    carries = tokens > 0
                elif choice.text is not None:
                    carries = True
                else:
                    # No running count: a chunk carries output unless it is chat's role-only opener.
                    delta = choice.delta
                    if delta is None:
                        carries = True
                    else:
                        text = delta.content or delta.reasoning_content or ""
                        carries = bool(text) or delta.role is UNSET
                if carries:
                    if r.ttft_s is None:
                        r.ttft_s = t
                    r.e2e_s = t
                    arrivals.append(t)
                    chunk_tokens.append(tokens)
        r.end_s = clock() - st
        usage = usage_final or usage_last
        if usage:
            r.prompt_tokens = usage.get("prompt_tokens")
            r.completion_tokens = usage.get("completion_tokens")
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
                r.cached_tokens = details["cached_tokens"]
        if self.require_done and not done:
            r.fail("truncated", f"stream ended without [DONE] after {len(r.chunk_arrivals_s)} chunks")
        elif r.ttft_s is None:
            r.fail("truncated", "stream ended without any output chunk")
        elif r.error_kind is None:
            r.ok = True
