"""The client's fast stream path (one split per read, msgspec-decoded events, msgspec-encoded bodies) gives
exactly what the original json.loads path gave, for any event stream cut into reads anywhere.

`_reference_read_stream` is the original parser, kept verbatim as the reference. A fake clock makes every
timestamp the number of the read it was taken at, so arrival times are compared exactly too.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvbench.core.scrub import excerpt
from kvbench.harness.client.backend import _SSE, OpenAIBackend, RequestResult, _decode_event, _encode
from kvbench.harness.client.scheduler import Concurrency, run_load
from kvbench.harness.client.workload import Prompt
from kvbench.testing.fakeserver import FakeConfig, FakeServer

# --- the reference: the parser before the fast path, verbatim --------------------------------------------


class _ReferenceSSE:
    def __init__(self):
        self.buf = b""

    def feed(self, data: bytes) -> list[str]:
        self.buf += data
        if b"\r" in self.buf:
            self.buf = self.buf.replace(b"\r\n", b"\n")
        out = []
        while True:
            cut = self.buf.find(b"\n\n")
            if cut < 0:
                return out
            event, self.buf = self.buf[:cut], self.buf[cut + 2 :]
            lines = [ln[5:].lstrip() for ln in event.split(b"\n") if ln.startswith(b"data:")]
            if lines:
                out.append(b"\n".join(lines).decode("utf-8", errors="replace"))


async def _reference_read_stream(resp, r: RequestResult, st: float, require_done: bool = True) -> None:
    clock = time.perf_counter
    sse = _ReferenceSSE()
    done = False
    last_ct = 0
    usage_final = None
    usage_last = None
    async for data in resp.content.iter_any():
        now = clock()
        for payload in sse.feed(data):
            if payload == "[DONE]":
                done = True
                continue
            try:
                event = json.loads(payload)
            except json.JSONDecodeError:
                r.fail("protocol", f"unparseable event: {payload[:200]}")
                return
            if not isinstance(event, dict):
                continue
            if "error" in event and not event.get("choices"):
                err = event["error"]
                msg = err.get("message", err) if isinstance(err, dict) else err
                r.fail("server_error", excerpt(f"error event: {msg}"))  # what a record keeps of server text
                return
            usage = event.get("usage")
            choices = event.get("choices") or []
            if not choices:
                if usage:
                    usage_final = usage
                continue
            if r.first_chunk_s is None:
                r.first_chunk_s = now - st
            choice = choices[0]
            if choice.get("finish_reason"):
                r.finish_reason = choice["finish_reason"]
            tokens = None
            if usage and usage.get("completion_tokens") is not None:
                usage_last = usage
                tokens = int(usage["completion_tokens"]) - last_ct
                last_ct = int(usage["completion_tokens"])
                carries = tokens > 0
            else:
                text = choice.get("text")
                if text is None:
                    delta = choice.get("delta") or {}
                    text = delta.get("content") or delta.get("reasoning_content") or ""
                    carries = bool(text) or "role" not in delta
                else:
                    carries = True
            if carries:
                t = now - st
                if r.ttft_s is None:
                    r.ttft_s = t
                r.e2e_s = t
                r.chunk_arrivals_s.append(t)
                r.chunk_tokens.append(tokens)
    r.end_s = clock() - st
    usage = usage_final or usage_last
    if usage:
        r.prompt_tokens = usage.get("prompt_tokens")
        r.completion_tokens = usage.get("completion_tokens")
    if require_done and not done:
        r.fail("truncated", f"stream ended without [DONE] after {len(r.chunk_arrivals_s)} chunks")
    elif r.ttft_s is None:
        r.fail("truncated", "stream ended without any output chunk")
    elif r.error_kind is None:
        r.ok = True


# --- streams ---------------------------------------------------------------------------------------------


class _Content:
    def __init__(self, reads):
        self.reads = reads

    async def iter_any(self):
        for data in self.reads:
            yield data


class _Resp:
    def __init__(self, reads):
        self.content = _Content(reads)


text = st.text(alphabet=st.sampled_from('ab é\u4e16\n"\\'), max_size=4)
counts = st.integers(0, 40)
usage = st.fixed_dictionaries(
    {}, optional={"prompt_tokens": counts, "completion_tokens": st.one_of(counts, st.none()), "total_tokens": counts}
)
finish = st.sampled_from([None, "length", "stop", ""])
completion_choice = st.fixed_dictionaries(
    {"index": st.just(0), "text": st.one_of(text, st.none()), "finish_reason": finish}
)
delta = st.fixed_dictionaries(
    {},
    optional={
        "role": st.sampled_from(["assistant", None]),
        "content": st.one_of(text, st.none()),
        "reasoning_content": st.one_of(text, st.none()),
    },
)
chat_choice = st.fixed_dictionaries(
    {"index": st.just(0), "delta": st.one_of(delta, st.none()), "finish_reason": finish}
)
chunk = st.fixed_dictionaries(
    {"id": st.just("cmpl-1"), "choices": st.lists(st.one_of(completion_choice, chat_choice), min_size=1, max_size=2)},
    optional={"usage": st.one_of(usage, st.none())},
)
error = st.fixed_dictionaries(
    {
        "error": st.one_of(
            text, st.none(), st.fixed_dictionaries({"message": text}), st.fixed_dictionaries({"code": counts})
        )
    },
    optional={"choices": st.just([])},
)
usage_only = st.fixed_dictionaries({"choices": st.sampled_from([[], None]), "usage": st.one_of(usage, st.none())})
event_json = st.one_of(chunk, chunk, chunk, usage_only, error).flatmap(
    lambda ev: st.sampled_from([json.dumps(ev), json.dumps(ev, ensure_ascii=False, separators=(",", ":"))])
)
odd = st.sampled_from(
    [
        "[DONE]",
        "[1, 2]",
        "3",
        '"text"',
        "null",
        "{not json",
        '{"choices": [{"text": "a", "logprobs": NaN}]}',
        '{"choices": [{"text": "b"}], "usage": {"completion_tokens": 2, "x": Infinity}}',
    ]
)
framing = st.sampled_from(
    ["data: {}\n\n", "data:{}\n\n", "data: {}\r\n\r\n", ": ping\n\ndata: {}\n\n", "data: {}\n\n\n"]
)


@st.composite
def streams(draw):
    events = draw(st.lists(st.one_of(event_json, event_json, event_json, odd), max_size=12))
    if draw(st.booleans()):
        events.append("[DONE]")
    raw = "".join(draw(framing).format(e) for e in events).encode()
    cuts = sorted(draw(st.lists(st.integers(0, len(raw)), max_size=8)))
    return [raw[a:b] for a, b in itertools.pairwise([0, *cuts, len(raw)])]


def _result(r: RequestResult) -> dict:
    return {k: v for k, v in r.as_dict().items() if k not in ("error",)} | {"error": (r.error or "")[:40]}


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reads=streams())
def test_fast_stream_path_matches_the_reference_for_any_reads(reads):
    backend = OpenAIBackend("http://127.0.0.1:1", "m")
    fast, ref = RequestResult(index=0), RequestResult(index=0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(time, "perf_counter", _Clock())
        asyncio.run(backend._read_stream(_Resp(reads), fast, 0.0, None))
        mp.setattr(time, "perf_counter", _Clock())
        asyncio.run(_reference_read_stream(_Resp(reads), ref, 0.0))
    assert _result(fast) == _result(ref)


@settings(max_examples=300, deadline=None)
@given(reads=streams())
def test_sse_split_is_independent_of_where_reads_end(reads):
    whole, pieces, ref = _SSE(), _SSE(), _ReferenceSSE()
    expected = whole.feed(b"".join(reads))
    got = [p for data in reads for p in pieces.feed(data)]
    assert got == expected == [p for data in reads for p in ref.feed(data)]
    assert pieces.buf == whole.buf


class _Clock:
    """Stands in for time.perf_counter: each call returns the next integer (one call per read, one at the end)."""

    def __init__(self):
        self.n = itertools.count()

    def __call__(self):
        return float(next(self.n))


def test_unexpected_event_shapes_are_protocol_errors_not_crashes():
    assert isinstance(_decode_event('{"choices": {"text": "a"}}'), str)  # choices must be a list
    assert isinstance(_decode_event('{"choices": [1]}'), str)
    assert _decode_event("[1]") is None and _decode_event("null") is None  # valid JSON, not an event: skipped
    ev = _decode_event('{"choices": [{"text": "a", "logprobs": NaN}], "usage": {"completion_tokens": 1}}')
    assert ev.choices[0].text == "a" and ev.usage == {"completion_tokens": 1}  # json.loads' NaN still accepted


def test_request_body_is_the_payload_as_json():
    backend = OpenAIBackend("http://x", "m", extra_body={"seed": 3, "stop": ("a", "b")})
    body = backend.payload(Prompt.of([1, 2]), 4)
    assert json.loads(_encode(body)) == json.loads(json.dumps(body))
    exotic = {"a": 1, "b": {1, 2}}  # msgspec encodes a set, json.dumps does not
    assert json.loads(_encode(exotic))["a"] == 1


@pytest.mark.parametrize("api", ["completions", "chat"])
@pytest.mark.parametrize("ttft_s", [0.0, 0.002])  # zero-compute: one write; paced: one write per chunk
@pytest.mark.parametrize("continuous", [True, False])
def test_chat_and_completions_through_the_fake(api, ttft_s, continuous):
    """Token counts from usage, one arrival per token-carrying chunk, nothing dropped, both APIs."""
    cfg = FakeConfig(ttft_s=ttft_s, itl_s=ttft_s / 2, tokens_per_chunk=3, continuous_usage=continuous)
    prompts = ["one two three four"] * 6
    with FakeServer(cfg) as srv:
        lr = asyncio.run(run_load(OpenAIBackend(srv.base_url, "kvbench-fake", api=api), prompts, 10, Concurrency(3)))
        log = srv.log()
    assert len(log) == 6 and all(e["max_tokens"] == 10 for e in log)
    for r in lr.results:
        assert r.ok, r.error
        assert r.completion_tokens == 10 and r.finish_reason == "length"
        assert len(r.chunk_arrivals_s) == 4  # 3 + 3 + 3 + 1 tokens; chat's role-only opener is no chunk
        assert r.chunk_tokens == ([3, 3, 3, 1] if continuous else [None] * 4)
        assert r.ttft_s >= ttft_s and r.chunk_arrivals_s == sorted(r.chunk_arrivals_s)
