"""Workloads as data (issue 14): every kind parses from TOML and from the shorthand, bad specs are one line,
token counts are exact, plans are deterministic, shared prefixes / trace blocks / conversations share exactly
what they should, distributions follow their parameters, and the bundled files are what bundle.toml says."""

from __future__ import annotations

import asyncio
import json
import math
import time
from pathlib import Path

import numpy as np
import pytest

from kvbench.core.datafiles import data_path, load_toml
from kvbench.core.errors import UsageError
from kvbench.core.tokenizer import load_tokenizer
from kvbench.harness.client.workload import Prompt, Workload, make_prompts
from kvbench.harness.workloads import (
    KINDS,
    FixedSpec,
    build,
    load_workloads,
    parse_spec,
    parse_workload,
    walk_sessions,
)
from kvbench.harness.workloads.lengths import Histogram, LogNormal, Normal, Uniform

VOCAB = 300  # synthetic completions kinds build from a vocabulary size alone


@pytest.fixture(scope="module")
def tok(tiny_model):
    return load_tokenizer(tiny_model)


def _ids(p: Prompt) -> list[int]:
    assert isinstance(p.content, list)
    return p.content


# --- parsing ----------------------------------------------------------------------------------------

SHORTHANDS = {
    "fixed": "fixed:prompt=64,output=16,requests=8",
    "random": "random:input=384,output=128,range=0.5,dist=uniform",
    "sharegpt": f"sharegpt:{data_path('workloads/sharegpt-small.json')},requests=16",
    "jsonl": f"jsonl:{data_path('workloads/requests-small.jsonl')},output=8",
    "shared-prefix": "shared-prefix:groups=8,prefix=256,suffix=64,output=32,requests=64",
    "multi-turn": "multi-turn:sessions=8,turns=4,user=64,reply=32,think=0.5",
    "trace": f"trace:{data_path('workloads/trace-small.jsonl')},time_scale=0.5",
}


def test_every_kind_parses_from_the_shipped_toml_and_from_the_shorthand():
    shipped = load_workloads()
    assert {s.kind for s in shipped.values()} == set(KINDS)
    assert all(s.name == name and s.label == name for name, s in shipped.items())
    for kind, text in SHORTHANDS.items():
        spec = parse_workload(text)
        assert spec.kind == kind and spec.name is None
        assert spec.label.startswith(f"{kind}:")
        # The label is itself a shorthand that makes the same spec (file kinds: run from the file's folder).
        if kind not in ("sharegpt", "jsonl", "trace"):
            assert parse_workload(spec.label) == spec
    # The shorthand and the equivalent table are the same spec.
    assert parse_workload(SHORTHANDS["shared-prefix"]) == parse_spec(
        {
            "kind": "shared-prefix",
            "groups": 8,
            "prefix_tokens": 256,
            "suffix_tokens": 64,
            "output_tokens": 32,
            "num_requests": 64,
        },
        "t",
    )
    mt = parse_workload(SHORTHANDS["multi-turn"])
    got = (mt.turns.min, mt.turns.max, mt.user_tokens.value, mt.reply_tokens.value, mt.think_time_s.seconds)
    assert got == (4, 4, 64, 32, 0.5)
    assert parse_workload("multi-turn:sessions=2,turns=2-6,user=8,reply=8").turns.max == 6
    rnd = parse_workload(SHORTHANDS["random"])
    assert (rnd.prompt.mean, rnd.prompt.range_ratio, rnd.output.mean) == (384, 0.5, 128)
    assert parse_workload(SHORTHANDS["trace"]).time_scale == 0.5
    # A table without kind is today's fixed shape, and maps to Workload.
    fixed = parse_spec({"prompt_tokens": 384, "output_tokens": 128}, "t")
    assert isinstance(fixed, FixedSpec)
    assert fixed.to_workload(num_requests=4, seed=2) == Workload(384, 128, 4, seed=2)
    assert FixedSpec.from_workload(Workload(10, 5, 3)).prompt_tokens == 10


def test_a_named_workload_comes_from_the_users_file_first(tmp_path):
    (tmp_path / "mine.json").write_text(data_path("workloads/sharegpt-small.json").read_text())
    f = tmp_path / "w.toml"
    f.write_text(
        "[workloads.fixed]\nprompt_tokens = 10\noutput_tokens = 2\n\n"
        '[workloads.mine]\nkind = "sharegpt"\npath = "mine.json"\n'
    )
    assert parse_workload("fixed", workloads_file=f).prompt_tokens == 10  # the user's, not the shipped one
    assert parse_workload("shared-prefix", workloads_file=f).groups == 8  # falls back to the shipped file
    assert parse_workload("mine", workloads_file=f).path == str(tmp_path / "mine.json")  # relative to the TOML


BAD_SHORTHAND = [
    ("shared-prefix:groups=0,prefix=256,suffix=64,output=32", "groups must be a whole number >= 1"),
    ("shared-prefix:groups=8,prefix=256,suffix=64", "output_tokens is required"),
    ("shared-prefix:groups=8,prefix=256,suffix=64,output=32,colour=3", "the form is shared-prefix:groups=N"),
    ("shared-prefix:groups=8,prefix=256,suffix=64,output=32,requests=4", "num_requests (4) must be >= groups (8)"),
    ("random:input=384,output=128,range=1.5", "range_ratio must be a number >= 0 and < 1"),
    ("random:input=384,output=128,range=nan", "range must be a finite number"),
    ("random:input=384,output=128,range=inf", "range must be a finite number"),
    ("random:input=384,output=128,dist=normal", "dist=normal needs cv"),
    ("random:input=384,output=128,dist=zipf", "unknown dist 'zipf'"),
    ("random:input=384,output=128,sigma=1", "sigma does not apply to dist=uniform"),
    ("random:input=3.5,output=1", "input must be a whole number"),
    ("random:output=1", "input is required"),
    (
        "multi-turn:sessions=8,turns=4,user=64,reply=32,think=-1",
        "think_time_s.seconds must be a number of seconds >= 0",
    ),
    ("multi-turn:sessions=8,turns=6-2,user=64,reply=32", "turns max (2) must be >= min (6)"),
    ("multi-turn:sessions=8,turns=x,user=64,reply=32", "turns must be a whole number or a range A-B"),
    ("trace:/no/such/trace.jsonl", "trace file '/no/such/trace.jsonl' not found"),
    ("sharegpt:", "name a file"),
    ("no-such-workload", "unknown workload 'no-such-workload'; choose from:"),
]


@pytest.mark.parametrize("text,fragment", BAD_SHORTHAND)
def test_bad_shorthand_is_one_line(text, fragment):
    with pytest.raises(UsageError) as exc:
        parse_workload(text)
    msg = str(exc.value)
    assert fragment in msg and "\n" not in msg, msg


def _random(prompt: dict) -> dict:
    return {"kind": "random", "prompt": prompt, "output": 5}


def _turns(**kw) -> dict:
    return {"kind": "multi-turn", "sessions": 2, "turns": 2, "user_tokens": 3, "reply_tokens": 3, **kw}


BAD_TABLES = [
    (_random({"dist": "uniform", "mean": 10, "range_ratio": 2}), "prompt.range_ratio must be a number >= 0 and < 1"),
    (_random({"dist": "lognormal", "median": 10}), "either median and p90, or mean and sigma"),
    (_random({"dist": "lognormal", "median": 10, "p90": 5}), "p90 (5) must be > median (10)"),
    (_random({"dist": "weird"}), "unknown dist 'weird'"),
    (_random({"mean": 3}), "prompt needs a dist key"),
    (_random({"dist": "histogram", "edges": [1, 5, 3], "weights": [1, 1]}), "strictly ascending"),
    (_random({"dist": "histogram", "edges": [1, 5, 9], "weights": [1]}), "one weight per bin"),
    (_random({"dist": "histogram", "edges": [1, 5], "weights": [0]}), "must not all be zero"),
    (
        _random({"dist": "uniform", "mean": 10, "bogus": 1}),
        "unknown key 'prompt.bogus'; valid keys: min, max, mean, range_ratio",
    ),
    (_random({"dist": "normal", "mean": 10, "std": math.inf}), "prompt.std must be a number >= 0"),
    (_random({"dist": "normal", "mean": math.nan, "std": 1}), "prompt.mean must be a number > 0"),
    (_random({"dist": "fixed", "value": 10, "min": 8, "max": 4}), "max (4) must be >= min (8)"),
    (_turns(turns={"min": 1, "max": 2, "x": 1}), "unknown key 'turns.x'; valid keys: min, max"),
    (_turns(think_time_s={"dist": "exponential", "mean": 0}), "think_time_s.mean must be a number of seconds > 0"),
    ({"prompt_tokens": True, "output_tokens": 3}, "prompt_tokens must be a whole number >= 1, got True"),
    ({"prompt_tokens": 64.0, "output_tokens": 3}, "prompt_tokens must be a whole number >= 1, got 64.0"),
    (
        {"prompt_tokens": 5, "output_tokens": 3, "concurrency": [4]},
        "unknown key 'concurrency'; valid keys: kind, prompt_tokens",
    ),
    (
        {"kind": "shared-prefix", "groups": 2, "prefix_tokens": 8, "suffix_tokens": -1, "output_tokens": 2},
        "suffix_tokens must be a whole number >= 0",
    ),
    ({"kind": "trace", "path": "x", "time_scale": 0}, "time_scale must be a number > 0"),
    ({"kind": "poisson"}, "unknown kind 'poisson'; choose from: fixed, random"),
    ({"kind": "fixed", "name": "x", "prompt_tokens": 1, "output_tokens": 1}, "'name' is not a key"),
]


@pytest.mark.parametrize("table,fragment", BAD_TABLES)
def test_bad_table_is_one_line_naming_the_key_and_the_valid_form(table, fragment):
    with pytest.raises(UsageError) as exc:
        parse_spec(table, "workload 'w' in f.toml")
    msg = str(exc.value)
    assert msg.startswith("workload 'w' in f.toml: ") and fragment in msg and "\n" not in msg, msg


@pytest.mark.parametrize(
    "content,fragment",
    [
        ("[workloads.a]\nprompt_tokens = 1\noutput_tokens = 1\n[slos.x]\n", "unknown top-level key(s) slos"),
        ("[workloads\n", "not valid TOML"),
        ("title = 1\n", "unknown top-level key(s) title"),
        ('[workloads.a]\nkind = "random"\nprompt = 4\n', "workload 'a' in"),
    ],
)
def test_bad_workloads_file_is_one_line(tmp_path, content, fragment):
    f = tmp_path / "w.toml"
    f.write_text(content)
    with pytest.raises(UsageError) as exc:
        load_workloads(f)
    assert fragment in str(exc.value) and "\n" not in str(exc.value)
    with pytest.raises(UsageError, match="no such file"):
        load_workloads(tmp_path / "missing.toml")


@pytest.mark.parametrize(
    "kind,name,content,fragment",
    [
        ("sharegpt", "s.json", '{"conversations": []}', "a ShareGPT file is a JSON list"),
        ("sharegpt", "s.json", '[{"conversations": [', "not valid JSON"),
        ("sharegpt", "s.json", "[3]", "entry 0 is int"),
        ("sharegpt", "s.json", '[{"conversations": [{"from": "human"}, {"value": "x"}]}]', 'need a text "value"'),
        (
            "sharegpt",
            "s.json",
            '[{"conversations": [{"value": "a"}, {"value": "b"}]}]',
            "no conversation passes the length filter",
        ),
        (
            "jsonl",
            "r.jsonl",
            '{"prompt": "a b c d", "output_tokens": 0}\n',
            "line 1: output_tokens must be a whole number >= 1",
        ),
        ("jsonl", "r.jsonl", '{"prompt": "abc", "prompt_tokens": 3, "output_tokens": 2}\n', 'either "prompt"'),
        ("jsonl", "r.jsonl", '{"prompt_tokens": 3}\n', 'no "output_tokens"'),
        ("jsonl", "r.jsonl", "not json\n", "line 1: not JSON"),
        (
            "trace",
            "t.jsonl",
            '{"timestamp": 5, "input_length": 3, "output_length": 2}\n{"timestamp": 1, "input_length": 3, '
            '"output_length": 2}\n',
            "line 2: timestamp 1 is earlier than the line before (5)",
        ),
        (
            "trace",
            "t.jsonl",
            '{"timestamp": 0, "input_length": 0, "output_length": 2}\n',
            "line 1: input_length must be a whole number >= 1",
        ),
        (
            "trace",
            "t.jsonl",
            '{"timestamp": 0, "input_length": 4, "output_length": 2, "hash_ids": [-1]}\n',
            "hash_ids must be whole numbers >= 0",
        ),
        ("trace", "t.jsonl", "\n", "no records"),
    ],
)
def test_bad_data_files_are_one_line(tok, tmp_path, kind, name, content, fragment):
    f = tmp_path / name
    f.write_text(content)
    spec = parse_spec({"kind": kind, "path": str(f)}, "w")
    with pytest.raises(UsageError) as exc:
        build(spec, tok)
    assert fragment in str(exc.value) and "\n" not in str(exc.value), str(exc.value)


def test_build_refuses_what_cannot_fit_or_be_sent(tok):
    with pytest.raises(UsageError, match="prompt_tokens \\+ output_tokens = 640 tokens does not fit max_model_len 512"):
        build(parse_workload("fixed:prompt=512,output=128,requests=2"), VOCAB, max_model_len=512)
    with pytest.raises(UsageError, match="does not fit max_model_len 300"):
        build(parse_workload(SHORTHANDS["shared-prefix"]), VOCAB, max_model_len=300)
    with pytest.raises(UsageError, match="need --api completions"):
        build(parse_workload(SHORTHANDS["shared-prefix"]), tok, api="chat")
    with pytest.raises(UsageError, match="give num_requests"):
        build(parse_workload("random:input=10,output=4"), VOCAB)
    with pytest.raises(UsageError, match="need the model's tokenizer"):
        build(parse_workload(SHORTHANDS["sharegpt"]), VOCAB)
    with pytest.raises(UsageError, match="holds 200 requests; 500 were asked for"):
        build(parse_workload(SHORTHANDS["trace"]), VOCAB, num_requests=500)


# --- exact, deterministic, fresh per stream ---------------------------------------------------------

SYNTHETIC = [
    "fixed:prompt=48,output=8,requests=12",
    "random:input=96,output=24,range=0.5,requests=40",
    "shared-prefix:groups=4,prefix=32,suffix=16,output=8,requests=20",
    "multi-turn:sessions=5,turns=2-4,user=12,reply=6,think=0.1",
    f"jsonl:{data_path('workloads/requests-small.jsonl')}",
]


@pytest.mark.parametrize("text", SYNTHETIC + [SHORTHANDS["trace"]])
def test_token_counts_are_exact_and_plans_deterministic_and_fresh_per_stream(tok, text):
    spec = parse_workload(text)
    a = build(spec, tok, seed=3, stream=1, max_model_len=512)
    b = build(spec, tok, seed=3, stream=1, max_model_len=512)
    assert a.exact and len(a) > 0
    assert [r.prompt for r in a.requests] == [r.prompt for r in b.requests]
    assert a.output_tokens == b.output_tokens and a.stats == b.stats
    for r in a.requests:
        if isinstance(r.prompt.content, list):
            assert len(r.prompt.content) == r.prompt.num_tokens == len(r.token_ids)
        else:  # jsonl text lines: the server's own count
            assert len(tok(r.prompt.content).input_ids) == r.prompt.num_tokens
        assert r.prompt.num_tokens + r.output_tokens <= 512 and r.output_tokens >= 1
    # A new stream: no 16-token block of any prompt is seen again (text lines of a file excepted).
    other = build(spec, tok, seed=3, stream=2, max_model_len=512)

    def blocks(plan):
        lists = [r.prompt.content for r in plan.requests if isinstance(r.prompt.content, list)]
        return {tuple(c[i : i + 16]) for c in lists for i in range(0, len(c) - 15, 16)}

    assert blocks(a) and not blocks(a) & blocks(other)
    assert not blocks(a) & blocks(build(spec, tok, seed=4, stream=1, max_model_len=512))


@pytest.mark.parametrize("text", SYNTHETIC[:2] + [SYNTHETIC[3], SHORTHANDS["sharegpt"]])
def test_chat_prompts_are_counted_after_the_chat_template(tok, text):
    plan = build(parse_workload(text), tok, seed=1, api="chat")
    assert plan.exact
    for r in plan.requests:
        messages = list(r.prompt.messages) if r.prompt.messages else [{"role": "user", "content": r.prompt.content}]
        rendered = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert len(tok.encode(rendered, add_special_tokens=False)) == r.prompt.num_tokens


def test_fixed_is_todays_prompts():
    plan = build(parse_workload("fixed:prompt=32,output=4,requests=6"), VOCAB, seed=5, stream=7)
    today = make_prompts(Workload(32, 4, 6, seed=5), VOCAB, stream=7)
    assert [r.prompt for r in plan.requests] == list(today) and plan.output_tokens == [4] * 6


def test_random_lengths_clip_to_max_model_len_and_say_so():
    spec = parse_spec(
        {
            "kind": "random",
            "prompt": {"dist": "uniform", "mean": 400, "range_ratio": 0.5},
            "output": 128,
            "num_requests": 50,
        },
        "t",
    )
    plan = build(spec, VOCAB, max_model_len=512)
    assert max(r.prompt.num_tokens + r.output_tokens for r in plan.requests) == 512
    assert all(r.output_tokens == 128 for r in plan.requests)
    assert plan.notes and "clipped to max_model_len 512" in plan.notes[0]
    unclipped = build(spec, VOCAB)
    assert max(r.prompt.num_tokens for r in unclipped.requests) > 384 and not unclipped.notes


def test_num_requests_overrides_and_a_prompt_does_not_depend_on_how_many_were_made():
    spec = parse_workload("fixed:prompt=16,output=2,requests=10")
    assert len(build(spec, VOCAB, num_requests=3)) == 3
    assert build(spec, VOCAB, num_requests=3).requests[2].prompt == build(spec, VOCAB).requests[2].prompt


# --- shared prefix ----------------------------------------------------------------------------------


def test_shared_prefixes_share_their_leading_ids_and_suffixes_differ():
    spec = parse_workload("shared-prefix:groups=4,prefix=64,suffix=32,output=8,requests=22")
    plan = build(spec, VOCAB, seed=2, stream=1)
    by_group: dict[int, list[list[int]]] = {}
    for r in plan.requests:
        assert r.prompt.num_tokens == 96 and r.output_tokens == 8
        by_group.setdefault(r.prefix_group, []).append(_ids(r.prompt))
    assert sorted(len(v) for v in by_group.values()) == [5, 5, 6, 6]  # 22 = 4 x 5 + 2
    prefixes = {g: {tuple(p[:64]) for p in ps} for g, ps in by_group.items()}
    assert all(len(v) == 1 for v in prefixes.values()) and len({next(iter(v)) for v in prefixes.values()}) == 4
    suffixes = [tuple(p[64:]) for ps in by_group.values() for p in ps]
    assert len(set(suffixes)) == len(suffixes)
    groups_in_order = [r.prefix_group for r in plan.requests]
    assert groups_in_order != sorted(groups_in_order)  # shuffled
    in_order = build(parse_spec({**spec.model_dump(), "shuffle": False}, "t"), VOCAB, seed=2, stream=1)
    assert [r.prefix_group for r in in_order.requests] == sorted(groups_in_order)
    reuse = plan.prefix_reuse(16)
    assert reuse["distinct_prefixes"] == 4 and reuse["shared_tokens"] == 4 * 64
    assert reuse["reusable_tokens"] == (22 - 4) * 64
    assert plan.stats["prefix"] == reuse


# --- multi-turn -------------------------------------------------------------------------------------


def test_each_turn_resends_the_conversation_so_far_plus_a_new_user_message(tok):
    spec = parse_spec(
        {
            "kind": "multi-turn",
            "sessions": 6,
            "turns": {"min": 2, "max": 5},
            "user_tokens": {"dist": "uniform", "mean": 20, "range_ratio": 0.5},
            "reply_tokens": 10,
            "think_time_s": {"dist": "exponential", "mean": 0.2},
            "max_concurrent_sessions": 3,
        },
        "t",
    )
    plan = build(spec, VOCAB, seed=1)
    assert len(plan.sessions) == 6 and plan.max_concurrent_sessions == 3
    assert sum(len(s.turns) for s in plan.sessions) == len(plan)
    assert {len(s.turns) for s in plan.sessions} <= {2, 3, 4, 5}
    for s in plan.sessions:
        assert [r.turn for r in s.turns] == list(range(len(s.turns))) and {r.session for r in s.turns} == {s.id}
        assert s.turns[0].think_s == 0.0 and all(r.think_s > 0 for r in s.turns[1:])
        for prev, nxt in zip(s.turns, s.turns[1:], strict=False):
            p, q = _ids(prev.prompt), _ids(nxt.prompt)
            assert q[: len(p)] == p  # turn k's prompt ...
            assert len(q) - len(p) - prev.output_tokens in range(10, 31)  # ... + its reply + a user message (20 ± 50%)
    # Chat: the messages so far, then the reply as an assistant message of exactly the tokens asked for.
    chat = build(spec, tok, seed=1, api="chat")
    for s in chat.sessions:
        for prev, nxt in zip(s.turns, s.turns[1:], strict=False):
            m, n = prev.prompt.messages, nxt.prompt.messages
            assert n[: len(m)] == m and n[len(m)]["role"] == "assistant" and n[-1]["role"] == "user"
            assert len(tok.encode(n[len(m)]["content"], add_special_tokens=False)) == prev.output_tokens
    reuse = plan.prefix_reuse(1)
    assert reuse["distinct_prefixes"] == 6
    # Only turn k's prompt can hit in turn k + 1 (the pre-drawn reply is not what the model generated).
    assert reuse["reusable_tokens"] == sum(r.prompt.num_tokens for s in plan.sessions for r in s.turns[:-1])


def test_sessions_end_before_a_turn_that_would_not_fit():
    spec = parse_workload("multi-turn:sessions=3,turns=6,user=40,reply=20")
    plan = build(spec, VOCAB, max_model_len=200)
    assert all(len(s.turns) == 3 for s in plan.sessions)  # turns 1-3 end at 160 tokens; turn 4 would need 220
    assert "3 of 3 sessions ended early" in plan.notes[0]
    # A phase that asks for n requests gets exactly n, sessions in order, the last one cut.
    assert len(build(spec, VOCAB, num_requests=10)) == 10
    assert [len(s.turns) for s in build(spec, VOCAB, num_requests=10).sessions] == [6, 4]


def test_walk_sessions_keeps_turn_order_think_time_and_the_session_cap():
    spec = parse_workload("multi-turn:sessions=5,turns=3,user=4,reply=2,think=0.05,concurrent=2")
    plan = build(spec, VOCAB)
    log, active, peak = [], set(), [0]

    async def send(r):
        active.add(r.session)
        peak[0] = max(peak[0], len(active))
        log.append((r.session, r.turn, time.monotonic()))
        await asyncio.sleep(0.01)
        if r.turn == 2:
            active.discard(r.session)

    asyncio.run(walk_sessions(plan, send))
    assert len(log) == 15 and peak[0] == 2
    for sid in range(5):
        times = [t for s, k, t in log if s == sid]
        assert [k for s, k, _ in log if s == sid] == [0, 1, 2]
        assert all(b - a >= 0.05 + 0.01 - 0.005 for a, b in zip(times, times[1:], strict=False))


# --- trace ------------------------------------------------------------------------------------------


def test_trace_requests_sharing_leading_hash_ids_share_exactly_those_blocks(tmp_path):
    lines = [
        {"timestamp": 1000, "input_length": 20, "output_length": 3, "hash_ids": [7, 8, 9]},
        {"timestamp": 1500, "input_length": 18, "output_length": 4, "hash_ids": [7, 8, 10]},
        {"timestamp": 1500, "input_length": 12, "output_length": 5, "hash_ids": [7, 11]},
        {"timestamp": 4000, "input_length": 30, "output_length": 6, "hash_ids": [7, 8]},  # 2 blocks for 30 tokens
        {"timestamp": 4200, "input_length": 6, "output_length": 2, "hash_ids": [12]},
    ]
    f = tmp_path / "t.jsonl"
    f.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    spec = parse_spec({"kind": "trace", "path": str(f), "block_tokens": 8, "time_scale": 0.5}, "t")
    plan = build(spec, VOCAB, seed=9)
    ids = [_ids(r.prompt) for r in plan.requests]
    assert [len(p) for p in ids] == [20, 18, 12, 30, 6] and plan.output_tokens == [3, 4, 5, 6, 2]
    assert [r.send_at_s for r in plan.requests] == [0.0, 0.25, 0.25, 1.5, 1.6]
    assert plan.requests[1].hash_ids == (7, 8, 10) and plan.timed and plan.stats["duration_s"] == 1.6
    assert ids[0][:16] == ids[1][:16] and ids[0][16] != ids[1][16]  # blocks 7, 8 shared; 9 vs 10 differ
    assert ids[0][:8] == ids[2][:8] and ids[0][8] != ids[2][8]
    assert ids[2][8:12] != ids[0][8:12]
    assert ids[3][:16] == ids[0][:16] and ids[3][16:] != ids[0][16:20]  # tokens no hash id covers are its own
    assert not set(map(tuple, [ids[4]])) & {tuple(p[:6]) for p in ids[:4]}
    assert "len(hash_ids) != ceil(input_length / 8)" in plan.notes[-1]  # the 30-token record
    # Clipped to max_model_len: the tail goes, the shared head stays.
    short = build(spec, VOCAB, seed=9, max_model_len=16)
    assert [len(_ids(r.prompt)) + r.output_tokens for r in short.requests][:2] == [16, 16]
    assert _ids(short.requests[0].prompt)[:8] == ids[0][:8] and "clipped" in short.notes[0]
    assert len(build(spec, VOCAB, num_requests=2)) == 2


def test_the_bundled_trace_replays_on_its_timestamps_scaled():
    spec = parse_workload(SHORTHANDS["trace"] + ",block=64")
    plan = build(spec, VOCAB)
    raw = [json.loads(x) for x in Path(spec.path).read_text().splitlines()]
    intended = [(x["timestamp"] - raw[0]["timestamp"]) / 1000 * 0.5 for x in raw]
    assert [r.send_at_s for r in plan.requests] == pytest.approx(intended)
    assert not plan.notes  # the bundled trace is consistent with 64-token blocks
    shared = plan.prefix_reuse(64)
    assert shared["ideal_hit_rate"] > 0.3 and shared["distinct_prefixes"] > 1


# --- dataset kinds ----------------------------------------------------------------------------------


def test_sharegpt_options_and_limits(tok):
    path = data_path("workloads/sharegpt-small.json")
    fixed_out = build(parse_workload(f"sharegpt:{path},requests=20,output=7"), tok)
    assert fixed_out.output_tokens == [7] * 20
    over = build(parse_workload(f"sharegpt:{path},requests=400"), tok)
    assert len(over) == 400 and "100 of 400 requests repeat a conversation" in over.notes[0]
    no_over = build(
        parse_spec({"kind": "sharegpt", "path": str(path), "num_requests": 400, "oversample": False}, "t"), tok
    )
    assert len(no_over) == 300 and "only 300 of 400" in no_over.notes[0]
    tight = build(parse_workload(f"sharegpt:{path}"), tok, max_model_len=128)
    assert all(r.prompt.num_tokens + r.output_tokens <= 128 for r in tight.requests)
    assert len(tight) < 300 and "skipped: prompt + output exceeds max_model_len 128" in tight.notes[0]
    # Another stream: another order of the same conversations.
    spec30 = parse_workload(f"sharegpt:{path},requests=30")
    a, b = build(spec30, tok), build(spec30, tok, stream=5)
    assert [r.source for r in a.requests] != [r.source for r in b.requests]


def test_jsonl_text_and_token_lines(tok):
    plan = build(parse_workload(SHORTHANDS["jsonl"].split(",")[0]), tok, seed=0)
    rows = [json.loads(x) for x in data_path("workloads/requests-small.jsonl").read_text().splitlines()]
    assert len(plan) == len(rows) == 32
    for r in plan.requests:
        row = rows[r.source]
        assert r.output_tokens == row["output_tokens"]
        if "prompt" in row:
            assert r.prompt.content == row["prompt"]
        else:
            assert r.prompt.num_tokens == len(r.prompt.content) == row["prompt_tokens"]
    more = build(parse_workload(SHORTHANDS["jsonl"].split(",")[0] + ",requests=40"), tok)
    assert len(more) == 40 and "requests repeat a text prompt" in more.notes[0]


# --- distributions ----------------------------------------------------------------------------------


def test_distributions_follow_their_parameters():
    rng = np.random.default_rng(0)
    u = Uniform(dist="uniform", mean=300, range_ratio=0.25)
    x = u.draw(rng, 20000)
    assert (x.min(), x.max()) == u.bounds() == (225, 375) and abs(x.mean() - 300) < 2
    assert (Uniform(dist="uniform", mean=7, range_ratio=0.5).bounds()) == (3, 11)  # floor / ceil, as vLLM
    n = Normal(dist="normal", mean=200, std=40).draw(rng, 20000)
    assert abs(n.mean() - 200) < 2 and abs(n.std() - 40) < 2
    ln = LogNormal(dist="lognormal", median=100, p90=300).draw(rng, 20000)
    assert abs(np.median(ln) - 100) < 4 and abs(np.percentile(ln, 90) - 300) < 15
    lm = LogNormal(dist="lognormal", mean=80, sigma=0.7).draw(rng, 40000)
    assert abs(lm.mean() - 80) < 2
    h = Histogram(dist="histogram", edges=[10, 20, 40, 100], weights=[1, 2, 1]).draw(rng, 20000)
    share = [np.mean((h >= a) & (h < b)) for a, b in [(10, 20), (20, 40), (40, 100)]]
    assert share == pytest.approx([0.25, 0.5, 0.25], abs=0.02) and h.min() >= 10 and h.max() < 100
    clipped = LogNormal(dist="lognormal", median=100, p90=300, min=20, max=150).draw(rng, 5000)
    assert clipped.min() == 20 and clipped.max() == 150


def test_plan_statistics_are_what_capacity_needs():
    plan = build(parse_workload("random:input=100,output=50,range=0.5,requests=400"), VOCAB)
    s = plan.stats
    prompt = np.array([r.prompt.num_tokens for r in plan.requests])
    assert s["prompt_tokens"]["mean"] == pytest.approx(prompt.mean()) and s["prompt_tokens"]["max"] == prompt.max()
    assert s["prompt_tokens"]["p90"] == pytest.approx(np.percentile(prompt, 90))
    assert s["total_tokens"] == prompt.sum() + sum(plan.output_tokens)
    assert s["sequence_tokens"]["max"] <= 150 + 75 and s["distinct_prompts"] == 400
    assert s["prefix"]["distinct_prefixes"] == 0
    d = plan.describe()
    assert d["workload"]["kind"] == "random" and d["lengths_exact"] and json.dumps(d)


# --- bundled data -----------------------------------------------------------------------------------


def test_bundled_files_regenerate_to_the_same_bytes_and_match_bundle_toml(tok):
    from kvbench.harness.workloads import bundle

    folder = data_path("workloads")
    for name, blob in bundle.generate(tok).items():
        assert (folder / name).read_bytes() == blob, f"{name} is stale: run python -m kvbench.harness.workloads.bundle"
    assert sum(f.stat().st_size for f in folder.iterdir()) < 400_000
    recipe = load_toml("workloads/bundle.toml")
    measured = bundle.measure(tok)
    for section in ("sharegpt", "trace"):
        assert measured[section] == pytest.approx(recipe[section]["measured"]), section
    # ... and the ShareGPT file follows the published means, scaled to the CPU default's context.
    sg, src = recipe["sharegpt"], recipe["sources"]["vllm_paper"]
    assert sg["scale"] == 512 / recipe["sources"]["vllm_sharegpt_filter"]["max_total_tokens"]
    assert sg["input_mean"] == pytest.approx(src["sharegpt_input_mean"] * sg["scale"], abs=0.01)
    assert sg["output_mean"] == pytest.approx(src["sharegpt_output_mean"] * sg["scale"], abs=0.01)
    assert measured["sharegpt"]["input_mean"] == pytest.approx(sg["input_mean"], rel=sg["tolerance"])
    assert measured["sharegpt"]["output_mean"] == pytest.approx(sg["output_mean"], rel=sg["tolerance"])
    assert measured["sharegpt"]["input_p50"] < measured["sharegpt"]["input_mean"]  # long-tailed, as ShareGPT is
    assert measured["sharegpt"]["usable"] == sg["conversations"]
    entries = sg["conversations"] + sg["single_turn_entries"] + sg["short_reply_entries"]
    assert measured["sharegpt"]["entries"] == entries
    assert measured["sharegpt"]["input_max"] + measured["sharegpt"]["output_max"] <= 2 * sg["max_total_tokens"]
    assert measured["trace"]["requests"] == recipe["trace"]["requests"]


def test_the_documented_examples_are_valid_specs(tmp_path):
    section = (Path(__file__).resolve().parents[2] / "docs" / "guide" / "workloads.md").read_text()
    toml = section.split("```toml\n", 1)[1].split("```", 1)[0]
    bundled = {"sharegpt": "sharegpt-small.json", "jsonl": "requests-small.jsonl", "trace": "trace-small.jsonl"}
    lines = []
    for line in toml.splitlines():  # the example's files live elsewhere: point at the bundled ones
        if line.startswith("path = "):
            kind = lines[-1].split('"')[1]
            line = f'path = "{data_path("workloads/" + bundled[kind])}"'
        lines.append(line)
    (tmp_path / "w.toml").write_text("\n".join(lines))
    specs = load_workloads(tmp_path / "w.toml")
    assert {s.kind for s in specs.values()} == set(KINDS) - {"fixed"}
    for text in [ln.split("#")[0].split()[1] for ln in section.splitlines() if ln.startswith("--workload ")]:
        if text.startswith(("random:", "shared-prefix:", "multi-turn:")):
            assert parse_workload(text.replace("[", "").split("]")[0])


def test_a_multi_turn_chat_prompt_is_sent_as_its_whole_conversation():
    from kvbench.harness.client.backend import OpenAIBackend

    messages = (
        {"role": "user", "content": "a b"},
        {"role": "assistant", "content": "c"},
        {"role": "user", "content": "d"},
    )
    chat = OpenAIBackend("http://127.0.0.1:9", "m", api="chat")
    assert chat.payload(Prompt("d", 9, True, messages=messages), 4)["messages"] == list(messages)
    assert chat.payload(Prompt("d", 3, True), 4)["messages"] == [{"role": "user", "content": "d"}]
    assert OpenAIBackend("http://127.0.0.1:9", "m").payload(Prompt([5, 6], 2, True), 4)["prompt"] == [5, 6]
