"""`build(spec, tokenizer, ...)`: the requests a workload spec asks for, exact in tokens, reproducible.

Deterministic from (seed, stream): the same pair gives the same plan (so every KV dtype is sent the same
requests), a different stream gives fresh prompts, so vLLM's prefix cache never sees one phase's prompts
again in the next; only the repeats a workload intends (shared prefixes, a conversation resent, trace blocks
under the same hash id) remain, and those are fresh per stream too. Dataset kinds send the file's texts:
a different stream draws them in another order, but a small file repeats texts across phases.

Prompts are token ids for the completions API (the server sees exactly those tokens) and text for chat
(built from words that are one token each, the templated length checked with the model's tokenizer, as
kvbench.harness.workload does). Shared-prefix and trace workloads need the completions API: only token ids
guarantee that the intended leading tokens are identical.

max_model_len: synthetic lengths (random, trace) are clipped so prompt + output fits (the prompt gives way;
the plan's notes count them); dataset rows that do not fit are skipped, as the server would refuse them;
fixed, shared-prefix and multi-turn turn 0 refuse a spec that cannot fit; multi-turn sessions end before
the turn that would not fit.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvbench.errors import UsageError
from kvbench.harness.workload import (
    Prompt,
    _encode,
    _fit,
    _single_token_words,
    _templated_len,
    allowed_token_ids,
    load_tokenizer,
    make_prompts,
)
from kvbench.harness.workloads.lengths import Uniform
from kvbench.harness.workloads.plan import PlannedRequest, RequestPlan, Session
from kvbench.harness.workloads.spec import explain

# Seed-sequence salts: one per use, large so they never equal a request index (numpy ignores trailing zero
# words of a seed sequence, so each salt is used with one arity only).
_SALT = {
    name: 2**31 + i
    for i, name in enumerate(
        ("random", "prefix", "suffix", "shuffle", "session", "block", "unique", "jsonl", "chat", "dataset")
    )
}


def _rng(seed: int, stream: int, salt: str, *index: int) -> np.random.Generator:
    return np.random.default_rng([int(seed), int(stream), _SALT[salt], *(int(i) for i in index)])


def build(
    spec,
    tokenizer: Any,
    *,
    seed: int = 0,
    stream: int = 0,
    max_model_len: int | None = None,
    api: str = "completions",
    num_requests: int | None = None,
) -> RequestPlan:
    """The plan for `spec`.

    tokenizer: the served model's tokenizer, or a local model folder (its tokenizer is loaded); synthetic
        completions kinds also accept a vocabulary size or a sequence of allowed ids.
    seed, stream: determinism (see the module docstring); with stream 0, `random` draws its lengths from
        numpy's default_rng(seed) exactly as `vllm bench serve --dataset-name random --seed` does, and
        `sharegpt` shuffles with Python's random.seed(seed) exactly as vLLM does.
    max_model_len: the server's context length (None: no limit).
    num_requests: overrides the spec's (a warm-up or probe phase asks for its own count). Multi-turn counts
        turns: sessions are made in order (past `sessions` if need be) until that many, the last one cut.
        Traces replay their first num_requests records and refuse more than they hold.
    """
    if api not in ("completions", "chat"):
        raise UsageError(f"api must be completions or chat, got {api!r}")
    if max_model_len is not None and max_model_len < 2:
        raise UsageError(f"max_model_len must be >= 2 tokens (a prompt and an output token), got {max_model_len}")
    if num_requests is not None and num_requests < 1:
        raise UsageError(f"num_requests must be a whole number >= 1, got {num_requests}")
    if api == "chat" and spec.kind in ("shared-prefix", "trace"):
        raise UsageError(
            f"{spec.kind} workloads need --api completions: only token-id prompts guarantee that "
            "the intended leading tokens are identical"
        )
    ctx = _Context(tokenizer, spec, seed, stream, max_model_len, api)
    builder = {
        "fixed": _fixed,
        "random": _random,
        "sharegpt": _sharegpt,
        "jsonl": _jsonl,
        "shared-prefix": _shared_prefix,
        "multi-turn": _multi_turn,
        "trace": _trace,
    }[spec.kind]
    return builder(ctx, num_requests)


class _Context:
    def __init__(self, tokenizer, spec, seed, stream, max_model_len, api):
        if isinstance(tokenizer, (str, Path)):
            tokenizer = load_tokenizer(tokenizer)
        self.is_vocab = isinstance(tokenizer, (int, np.integer, list, tuple, np.ndarray, range))
        self.tok = None if self.is_vocab else tokenizer
        self.source = tokenizer
        self.spec, self.seed, self.stream, self.mml, self.api = spec, seed, stream, max_model_len, api
        self.notes: list[str] = []
        if self.tok is None and (api == "chat" or spec.kind in ("sharegpt", "jsonl")):
            over = " over chat" if api == "chat" else ""
            raise UsageError(f"{spec.kind} workloads{over} need the model's tokenizer, not a vocabulary size")

    @cached_property
    def allowed(self) -> np.ndarray:
        return allowed_token_ids(self.source)

    @cached_property
    def words(self) -> list[str]:
        return _single_token_words(self.tok)

    @cached_property
    def overhead(self) -> int:
        return _templated_len(self.tok, "")

    def n(self, num_requests: int | None, natural: int | None = None) -> int:
        n = num_requests if num_requests is not None else getattr(self.spec, "num_requests", None)
        n = natural if n is None else n
        if n is None:
            raise UsageError(f"workload {self.spec.label}: give num_requests (in its spec, or --num-requests)")
        return n

    # -- prompts ------------------------------------------------------------------------------------

    def ids(self, rng: np.random.Generator, n: int) -> list[int]:
        return rng.choice(self.allowed, size=n).tolist()

    def synthetic(self, rng: np.random.Generator, n: int) -> tuple[Prompt, tuple[int, ...]]:
        """A prompt of exactly n tokens: token ids, or chat text fitted to n templated tokens."""
        if self.api == "completions":
            ids = self.ids(rng, n)
            return Prompt(ids, n, True), tuple(ids)
        pool = [self.words[j] for j in rng.integers(0, len(self.words), size=n + 64)]
        text, measured = _fit(self.tok, pool, max(1, n - self.overhead), n)
        return Prompt(text, measured, measured == n), tuple(self.chat_ids([{"role": "user", "content": text}]))

    def text(self, text: str) -> tuple[Prompt, tuple[int, ...]]:
        """A dataset text as it is sent: completions counts it as the server does (special tokens added)."""
        if self.api == "completions":
            ids = tuple(self.tok(text).input_ids)
            return Prompt(text, len(ids), True), ids
        ids = tuple(self.chat_ids([{"role": "user", "content": text}]))
        return Prompt(text, len(ids), True), ids

    def chat_ids(self, messages: list[dict[str, str]]) -> list[int]:
        if not getattr(self.tok, "chat_template", None):
            if len(messages) == 1:
                return _encode(self.tok, messages[0]["content"])
            raise UsageError("multi-turn chat workloads need a tokenizer with a chat template")
        rendered = self.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return _encode(self.tok, rendered)

    def words_text(self, rng: np.random.Generator, n: int) -> str:
        """n single-token words: n content tokens."""
        return " ".join(self.words[j] for j in rng.integers(0, len(self.words), size=n))

    def fit(self, prompt: int, output: int) -> tuple[int, int, bool]:
        """Clip so prompt + output <= max_model_len; the prompt gives way."""
        if self.mml is None or prompt + output <= self.mml:
            return prompt, output, False
        output = min(output, self.mml - 1)
        return max(1, self.mml - output), output, True

    def plan(self, requests: list[PlannedRequest], **kw) -> RequestPlan:
        off = sum(1 for r in requests if not r.prompt.exact)
        if off and self.spec.kind != "fixed":  # fixed: make_prompts' own note says it
            self.notes.append(
                f"chat prompt lengths are approximate: {off} of {len(requests)} could not be made "
                f"exactly their length after the chat template (template alone: {self.overhead} "
                "tokens); num_tokens holds the local count"
            )
        return RequestPlan(
            self.spec, self.api, self.seed, self.stream, self.mml, tuple(requests), notes=tuple(self.notes), **kw
        )


def _too_long(ctx: _Context, what: str, total: int) -> UsageError:
    return UsageError(f"workload {ctx.spec.label}: {what} = {total} tokens does not fit max_model_len {ctx.mml}")


# --- kinds ------------------------------------------------------------------------------------------


def _fixed(ctx: _Context, num_requests):
    s = ctx.spec
    n = ctx.n(num_requests)
    if ctx.mml is not None and s.prompt_tokens + s.output_tokens > ctx.mml:
        raise _too_long(ctx, "prompt_tokens + output_tokens", s.prompt_tokens + s.output_tokens)
    # Exactly today's prompts (kvbench.harness.workload.make_prompts), so a fixed spec changes nothing.
    prompts = make_prompts(s.to_workload(num_requests=n, api=ctx.api, seed=ctx.seed), ctx.source, stream=ctx.stream)
    reqs = []
    for i, p in enumerate(prompts):
        if ctx.api == "completions":
            ids = tuple(p.content)
        else:
            ids = tuple(ctx.chat_ids([{"role": "user", "content": p.content}]))
        reqs.append(PlannedRequest(i, p, s.output_tokens, token_ids=ids))
    if not prompts.exact:
        ctx.notes.append(prompts.note)
    return ctx.plan(reqs)


def _random(ctx: _Context, num_requests):
    s = ctx.spec
    n = ctx.n(num_requests)
    # With stream 0 this generator is numpy's default_rng(seed), and uniform lengths are drawn with the same
    # two calls as vLLM's get_sampling_params: the same lengths as `vllm bench serve --dataset-name random`.
    lengths = np.random.default_rng([int(ctx.seed), int(ctx.stream)])
    prompt_dist, special = s.prompt, 0
    if isinstance(s.prompt, Uniform) and ctx.api == "completions" and ctx.tok is not None:
        # vLLM draws the text's length without the tokens the tokenizer adds (a BOS) and the server adds them
        # back: the same draw, plus those tokens, is what its engine sees.
        special = int(ctx.tok.num_special_tokens_to_add())
        prompt_dist = s.prompt.model_copy(update={"mean": max(1, s.prompt.mean - special)})
    prompt_lens = prompt_dist.draw(lengths, n) + special
    output_lens = s.output.draw(lengths, n)
    reqs, clipped = [], 0
    for i in range(n):
        p, o, cut = ctx.fit(int(prompt_lens[i]), int(output_lens[i]))
        clipped += cut
        prompt, ids = ctx.synthetic(_rng(ctx.seed, ctx.stream, "random", i), p)
        reqs.append(PlannedRequest(i, prompt, o, token_ids=ids))
    if clipped:
        ctx.notes.append(f"{clipped} of {n} drawn lengths clipped to max_model_len {ctx.mml} (prompt shortened)")
    return ctx.plan(reqs)


def _shared_prefix(ctx: _Context, num_requests):
    s = ctx.spec
    n = ctx.n(num_requests)
    if n < s.groups:
        raise UsageError(f"workload {s.label}: {n} requests cannot cover {s.groups} groups (num_requests >= groups)")
    total = s.prefix_tokens + s.suffix_tokens
    if ctx.mml is not None and total + s.output_tokens > ctx.mml:
        raise _too_long(ctx, "prefix_tokens + suffix_tokens + output_tokens", total + s.output_tokens)
    # vLLM's prefix_repetition shape: each prefix, then its requests (n // groups each; here the remainder
    # goes one each to the first groups instead of being dropped), then one shuffle.
    per_group = [n // s.groups + (g < n % s.groups) for g in range(s.groups)]
    rows = []
    for g, count in enumerate(per_group):
        prefix = ctx.ids(_rng(ctx.seed, ctx.stream, "prefix", g), s.prefix_tokens)
        for j in range(count):
            rows.append((g, prefix + ctx.ids(_rng(ctx.seed, ctx.stream, "suffix", g, j), s.suffix_tokens)))
    order = _rng(ctx.seed, ctx.stream, "shuffle").permutation(len(rows)) if s.shuffle else range(len(rows))
    reqs = [
        PlannedRequest(
            i, Prompt(rows[k][1], total, True), s.output_tokens, prefix_group=rows[k][0], token_ids=tuple(rows[k][1])
        )
        for i, k in enumerate(order)
    ]
    return ctx.plan(reqs)


def _multi_turn(ctx: _Context, num_requests):
    """Each turn's prompt is the conversation so far plus a new user message; the assistant messages resent
    are pre-drawn replies of exactly the length each turn asked for, not what the model generated, so every
    prompt is exact in tokens. The cost: vLLM caches the blocks the model generated, which differ from the
    pre-drawn reply, so only turn k's prompt (not its reply) can hit the cache in turn k + 1 — a lower bound
    on real chat, whose resent reply can hit too."""
    s = ctx.spec
    limit = num_requests  # None: every session in full
    sessions, reqs, ended_early = [], [], 0
    sid = 0
    while (limit is None and sid < s.sessions) or (limit is not None and len(reqs) < limit):
        rng = _rng(ctx.seed, ctx.stream, "session", sid)
        turns = int(rng.integers(s.turns.min, s.turns.max + 1))
        users, replies = s.user_tokens.draw(rng, turns), s.reply_tokens.draw(rng, turns)
        thinks = s.think_time_s.draw(rng, turns)
        if limit is not None:
            turns = min(turns, limit - len(reqs))
        history_ids: list[int] = []
        messages: list[dict[str, str]] = []
        session_reqs = []
        for k in range(turns):
            u, r = int(users[k]), int(replies[k])
            if k == 0:
                u, r, cut = ctx.fit(u, r)
                if cut:
                    raise _too_long(ctx, "turn 0's user_tokens + reply_tokens", int(users[0]) + int(replies[0]))
            if ctx.api == "completions":
                prompt_ids = history_ids + ctx.ids(rng, u)
                if ctx.mml is not None and len(prompt_ids) + r > ctx.mml:
                    ended_early += 1
                    break
                prompt, ids = Prompt(prompt_ids, len(prompt_ids), True), tuple(prompt_ids)
                history_ids = prompt_ids + ctx.ids(rng, r)
            else:
                turn_messages = messages + [{"role": "user", "content": ctx.words_text(rng, u)}]
                ids = tuple(ctx.chat_ids(turn_messages))
                if ctx.mml is not None and len(ids) + r > ctx.mml:
                    ended_early += 1
                    break
                prompt = Prompt(turn_messages[-1]["content"], len(ids), True, messages=tuple(turn_messages))
                messages = turn_messages + [{"role": "assistant", "content": ctx.words_text(rng, r)}]
            req = PlannedRequest(
                len(reqs), prompt, r, session=sid, turn=k, think_s=float(thinks[k]) if k else 0.0, token_ids=ids
            )
            reqs.append(req)
            session_reqs.append(req)
        sessions.append(Session(sid, tuple(session_reqs)))
        sid += 1
        if limit is not None and sid > 100 * limit:
            break  # cannot happen while turn 0 always fits; a guard against an endless loop
    if ended_early:
        ctx.notes.append(
            f"{ended_early} of {len(sessions)} sessions ended early: their next turn would not fit "
            f"max_model_len {ctx.mml}"
        )
    return ctx.plan(reqs, sessions=tuple(sessions), max_concurrent_sessions=min(len(sessions), s.concurrent))


# --- dataset files ----------------------------------------------------------------------------------


def _vllm_valid(prompt_len: int, output_len: int, s, fixed_output: bool) -> bool:
    """vLLM's is_valid_sequence with the spec's limits."""
    return not (
        prompt_len < s.min_tokens
        or (not fixed_output and output_len < s.min_tokens)
        or prompt_len > s.max_prompt_tokens
        or prompt_len + output_len > s.max_total_tokens
    )


def _order_random(ctx: _Context) -> random.Random:
    # Stream 0: vLLM's own random.seed(seed) sequence. Other streams: another order of the same rows.
    seed = ctx.seed if ctx.stream == 0 else int(_rng(ctx.seed, ctx.stream, "dataset").integers(2**63))
    return random.Random(seed)


def _sharegpt(ctx: _Context, num_requests):
    """As vLLM's ShareGPTDataset: keep entries with 2+ conversation turns, shuffle (random.seed(seed)),
    walk them: first turn = prompt, second = completion, skip pairs failing is_valid_sequence (and, here,
    pairs that do not fit max_model_len), stop at num_requests, then oversample with random.choice."""
    s = ctx.spec
    pairs = _sharegpt_pairs(s.path)
    rows = list(range(len(pairs)))
    order = _order_random(ctx)
    if s.shuffle:
        order.shuffle(rows)
    # No count asked for: every conversation that passes the filter, none repeated.
    everything = num_requests is None and s.num_requests is None
    n = ctx.n(num_requests, natural=len(rows))
    fixed_output = s.output_tokens is not None
    picked, too_long = [], 0
    for i in rows:
        if len(picked) >= n:
            break
        source, prompt_text, completion = pairs[i]
        prompt_len = len(ctx.tok(prompt_text).input_ids)
        out = s.output_tokens if fixed_output else len(ctx.tok(completion).input_ids)
        if not _vllm_valid(prompt_len, out, s, fixed_output):
            continue
        if ctx.mml is not None and prompt_len + out > ctx.mml:
            too_long += 1
            continue
        prompt, ids = ctx.text(prompt_text)
        picked.append((source, prompt, out, ids))
    if not picked:
        raise UsageError(
            f"{s.path}: no conversation passes the length filter (prompt and output >= {s.min_tokens}, "
            f"prompt <= {s.max_prompt_tokens}, total <= {s.max_total_tokens}"
            + (f", total <= max_model_len {ctx.mml}" if ctx.mml else "")
            + " tokens)"
        )
    if too_long:
        ctx.notes.append(f"{too_long} conversations skipped: prompt + output exceeds max_model_len {ctx.mml}")
    extra = []
    if len(picked) < n and not everything:
        if s.oversample:
            # vLLM's maybe_oversample_requests: random.seed(seed), then random.choice per missing request.
            again = _order_random(ctx)
            extra = [again.choice(picked) for _ in range(n - len(picked))]
            ctx.notes.append(
                f"{len(extra)} of {n} requests repeat a conversation (oversampled, as vLLM does: "
                f"only {len(picked)} pass the filter)"
            )
        else:
            ctx.notes.append(f"only {len(picked)} of {n} requested conversations pass the filter (oversample = false)")
    reqs = [
        PlannedRequest(k, prompt, out, source=i, token_ids=ids)
        for k, (i, prompt, out, ids) in enumerate(picked + extra)
    ]
    return ctx.plan(reqs)


def _sharegpt_pairs(path: str) -> tuple[tuple[int, str, str], ...]:
    """(entry index, first turn, second turn) of every entry with 2+ turns, in file order (vLLM's filter)."""
    st = Path(path).stat()
    return _sharegpt_pairs_cached(path, st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=4)
def _sharegpt_pairs_cached(path: str, mtime_ns: int, size: int) -> tuple[tuple[int, str, str], ...]:
    # Every phase builds its own plan; the real ShareGPT file is hundreds of MB of JSON, so it is parsed once and
    # only the two turns vLLM reads are kept.
    data = _read_json(path)
    if not isinstance(data, list):
        raise UsageError(
            f'{path}: a ShareGPT file is a JSON list of {{"conversations": [...]}} entries, got {type(data).__name__}'
        )
    pairs = []
    for i, entry in enumerate(data):
        if not isinstance(entry, dict):
            raise UsageError(f'{path}: entry {i} is {type(entry).__name__}, not an object with "conversations"')
        conv = entry.get("conversations")
        if isinstance(conv, list) and len(conv) >= 2:
            for turn in conv[:2]:
                if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
                    raise UsageError(
                        f'{path}: entry {i} (id {entry.get("id")!r}): conversation turns need a text "value"'
                    )
            pairs.append((i, conv[0]["value"], conv[1]["value"]))
    return tuple(pairs)


class _JsonlLine(BaseModel):
    # Data rows, not a spec: other keys (ids, metadata) are allowed and ignored, as vLLM's custom loader does.
    model_config = ConfigDict(extra="ignore", strict=True)
    prompt: str | None = Field(None, min_length=1, description="text")
    prompt_tokens: int | None = Field(None, ge=1, description="a whole number >= 1")
    output_tokens: int | None = Field(None, ge=1, description="a whole number >= 1")


def _jsonl(ctx: _Context, num_requests):
    s = ctx.spec
    lines = []
    for lineno, raw in enumerate(_read_lines(s.path), start=1):
        if not raw.strip():
            continue
        where = f"{s.path} line {lineno}"
        try:
            row = _JsonlLine.model_validate(json.loads(raw))
        except json.JSONDecodeError as exc:
            raise UsageError(f"{where}: not JSON ({exc.msg})") from None
        except ValidationError as exc:
            raise UsageError(explain(exc, where, _JsonlLine)) from None
        if (row.prompt is None) == (row.prompt_tokens is None):
            raise UsageError(f'{where}: give either "prompt" (text) or "prompt_tokens" (a count), not both or neither')
        if row.output_tokens is None and s.output_tokens is None:
            raise UsageError(f'{where}: no "output_tokens" (give it per line, or output_tokens in the workload)')
        lines.append((lineno - 1, row))
    if not lines:
        raise UsageError(f"{s.path}: no requests (one JSON object per line)")
    order = _order_random(ctx)
    if s.shuffle:
        order.shuffle(lines)
    n = ctx.n(num_requests, natural=len(lines))
    reqs, clipped, skipped, repeats = [], 0, 0, 0
    asked_out, cut_out = 0, 0  # output lengths the context cannot hold: said, never clipped silently
    for k in range(n):
        source, row = lines[k % len(lines)]
        out = s.output_tokens or row.output_tokens
        if row.prompt is not None:
            repeats += k >= len(lines)
            prompt, ids = ctx.text(row.prompt)
            if ctx.mml is not None and prompt.num_tokens + out > ctx.mml:
                skipped += 1
                continue
        else:
            asked = out
            p, out, cut = ctx.fit(row.prompt_tokens, out)
            clipped += cut
            if out < asked:
                cut_out, asked_out = cut_out + 1, max(asked_out, asked)
            prompt, ids = ctx.synthetic(_rng(ctx.seed, ctx.stream, "jsonl", k), p)
        reqs.append(PlannedRequest(len(reqs), prompt, out, source=source, token_ids=ids))
    if not reqs:
        raise UsageError(f"{s.path}: no line fits max_model_len {ctx.mml}")
    if skipped:
        ctx.notes.append(f"{skipped} text prompts skipped: prompt + output exceeds max_model_len {ctx.mml}")
    if clipped:
        ctx.notes.append(f"{clipped} prompt_tokens lines clipped to max_model_len {ctx.mml} (prompt shortened)")
    if cut_out:
        ctx.notes.append(
            f"{cut_out} lines ask for more output tokens than max_model_len {ctx.mml} holds (up to {asked_out:,}): "
            f"their output was cut to {ctx.mml - 1:,} tokens and their prompt to 1"
        )
    if repeats:
        ctx.notes.append(f"{repeats} requests repeat a text prompt: the file has {len(lines)} lines")
    return ctx.plan(reqs)


# --- trace ------------------------------------------------------------------------------------------


class _TraceLine(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)
    timestamp: float = Field(ge=0, description="a number of milliseconds >= 0")
    input_length: int = Field(ge=1, description="a whole number >= 1")
    output_length: int = Field(ge=1, description="a whole number >= 1")
    hash_ids: list[int] = Field(default_factory=list, description="a list of whole numbers >= 0")


def read_trace(path: str) -> list[tuple[int, _TraceLine]]:
    """(line number, record) for every record of a Mooncake-style trace; one-line errors."""
    out, last = [], None
    for lineno, raw in enumerate(_read_lines(path), start=1):
        if not raw.strip():
            continue
        where = f"{path} line {lineno}"
        try:
            rec = _TraceLine.model_validate(json.loads(raw))
        except json.JSONDecodeError as exc:
            raise UsageError(f"{where}: not JSON ({exc.msg})") from None
        except ValidationError as exc:
            raise UsageError(explain(exc, where, _TraceLine)) from None
        if any(h < 0 for h in rec.hash_ids):
            raise UsageError(f"{where}: hash_ids must be whole numbers >= 0")
        if last is not None and rec.timestamp < last:
            raise UsageError(
                f"{where}: timestamp {rec.timestamp:g} is earlier than the line before ({last:g}); "
                "a trace is replayed in file order, so timestamps must not decrease"
            )
        last = rec.timestamp
        out.append((lineno, rec))
    if not out:
        raise UsageError(
            f"{path}: no records (one JSON object per line: timestamp, input_length, output_length, hash_ids)"
        )
    return out


def _trace(ctx: _Context, num_requests):
    """Mooncake's format (FAST'25 trace release, kvcache-ai/Mooncake FAST25-release/README.md): `timestamp`
    (ms since the first request), `input_length`, `output_length`, `hash_ids` (remapped block hashes). A
    hash id stands for one block of `block_tokens` tokens (512 in Mooncake's traces: len(hash_ids) =
    ceil(input_length / 512) there; NVIDIA Dynamo's trace tools assume the same default block size).

    Block h's tokens are drawn from (seed, stream, h) alone, and request i's prompt is its hash ids' blocks in
    order, the last one cut to the input length, then request-unique tokens for any length the hash ids do
    not cover: requests sharing leading hash ids share exactly those leading tokens."""
    s = ctx.spec
    records = read_trace(s.path)
    n = ctx.n(num_requests, natural=len(records))
    trace_timing(s, records, n)  # refuses a replay longer than the spec allows
    t0 = records[0][1].timestamp
    blocks: dict[int, list[int]] = {}
    reqs, clipped, mismatched, ignored = [], 0, 0, 0
    for i, (lineno, rec) in enumerate(records[:n]):
        length, out, cut = ctx.fit(rec.input_length, rec.output_length)
        clipped += cut
        mismatched += len(rec.hash_ids) != math.ceil(rec.input_length / s.block_tokens)
        ids: list[int] = []
        for j, h in enumerate(rec.hash_ids):
            take = min(s.block_tokens, length - j * s.block_tokens)
            if take <= 0:
                ignored += len(rec.hash_ids) - j
                break
            if h not in blocks:
                blocks[h] = ctx.ids(_rng(ctx.seed, ctx.stream, "block", h), s.block_tokens)
            ids += blocks[h][:take]
        if len(ids) < length:
            ids += ctx.ids(_rng(ctx.seed, ctx.stream, "unique", i), length - len(ids))
        reqs.append(
            PlannedRequest(
                i,
                Prompt(ids, length, True),
                out,
                hash_ids=tuple(rec.hash_ids),
                send_at_s=(rec.timestamp - t0) / 1000.0 * s.time_scale,
                source=lineno - 1,
                token_ids=tuple(ids),
            )
        )
    if clipped:
        ctx.notes.append(f"{clipped} of {n} trace requests clipped to max_model_len {ctx.mml} (prompt tail cut)")
    if mismatched:
        ctx.notes.append(
            f"{mismatched} of {n} trace records have len(hash_ids) != "
            f"ceil(input_length / {s.block_tokens}): is block_tokens the trace's block size?"
        )
    return ctx.plan(reqs)


def trace_timing(spec, records: list | None = None, num_requests: int | None = None) -> str:
    """How long replaying the trace's first `num_requests` records (default: all) takes, and its longest idle
    gap, in one line; a UsageError when that is more than the spec's max_span_s or more records than it holds."""
    records = records if records is not None else read_trace(spec.path)
    n = num_requests or spec.num_requests or len(records)
    if n > len(records):
        raise UsageError(
            f"{spec.path} holds {len(records)} requests; {n} were asked for (a trace is replayed, not resampled)"
        )
    at = [(rec.timestamp - records[0][1].timestamp) / 1000.0 * spec.time_scale for _, rec in records[:n]]
    span = at[-1]
    if span > spec.max_span_s:
        raise UsageError(
            f"{spec.path}: replaying {n:,} requests takes {_duration(span)} at time_scale {spec.time_scale:g}, more "
            f"than max_span_s = {spec.max_span_s:g} s; raise max_span_s (trace:FILE,max_span=SECONDS), lower "
            "time_scale or replay fewer requests"
        )
    gaps = [b - a for a, b in zip(at, at[1:], strict=False)]
    widest = max(range(len(gaps)), key=gaps.__getitem__) if gaps else None
    gap = f"; longest idle gap {_duration(gaps[widest])} before request {widest + 2}" if widest is not None else ""
    return f"trace replay: {n:,} requests over {_duration(span)}{gap}"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:,.1f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:,.1f} min ({seconds:,.0f} s)"
    return f"{seconds / 3600:,.1f} h ({seconds:,.0f} s)"


# --- files ------------------------------------------------------------------------------------------


def _read_json(path: str) -> Any:
    from kvbench.datafiles import read_json

    return read_json(Path(path), missing=f"{path}: no such file", bad="not valid JSON")


def _read_lines(path: str) -> Sequence[str]:
    try:
        return Path(path).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not UTF-8 text") from None
