"""`kvbench run --workload`: each request goes out with its own prompt and output length, a trace on its own
send times, a multi-turn workload as conversations; the record says which, and the prefix-cache numbers come
from the real server's /metrics. Fake servers for timing and shape; the shared real vLLM for the cache."""

from __future__ import annotations

import pytest
from support import kvbench, run_against

from kvbench import records
from kvbench.testing.fakeserver import FakeConfig, FakeServer

FAST = dict(kv_cache_dtype="auto", max_model_len=512, ttft_s=0.002, itl_s=0.0005)
TRACE = "kvbench/data/workloads/trace-small.jsonl"  # the bundled trace, relative to the checkout (kvbench's cwd)


def test_random_lengths_go_out_per_request_and_capacity_reads_the_distribution(tmp_path, tiny_model):
    with FakeServer(FakeConfig(**FAST)) as srv:
        doc, samples = run_against(
            srv.base_url,
            tiny_model,
            "random:input=200,output=64,range=0.5,requests=24",
            tmp_path,
            "--no-search",
            "--concurrency",
            "4",
        )
    d = doc["dtypes"][0]
    fixed = samples[(samples.phase == "fixed") & ~samples.warmup]
    assert len(fixed) == 24 and fixed.ok.all()
    assert fixed.requested_output_tokens.nunique() > 5  # each request its own length ...
    assert fixed.requested_output_tokens.between(32, 96).all()
    assert (fixed.completion_tokens == fixed.requested_output_tokens).all()  # ... and got exactly that many
    assert fixed.expected_prompt_tokens.between(100, 300).all() and fixed.expected_prompt_tokens.nunique() > 5
    assert d["phases"][-1]["summary"]["output_tokens"] is None  # no single output length to state
    dist = d["capacity"]["distribution"]
    assert dist["max_model_len"]["tokens"] == 512
    assert dist["mean"]["tokens"] < dist["p99"]["tokens"] <= 512  # sequences shorter than the worst case ...
    assert dist["mean"]["max_concurrency"] >= dist["max_model_len"]["max_concurrency"]  # ... fit more of them
    assert doc["config"]["workload_spec"]["kind"] == "random"
    shown = kvbench("report", str(records.find_records(tmp_path)[0])).stdout
    assert "workload random" in shown and "Requests that fit at the workload's own lengths" in shown


@pytest.mark.parametrize(
    "workload, kind",
    [
        ("sharegpt:kvbench/data/workloads/sharegpt-small.json,requests=16", "sharegpt"),
        ("jsonl:kvbench/data/workloads/requests-small.jsonl,requests=16", "jsonl"),
    ],
)
def test_dataset_files_run_each_conversation_at_its_own_lengths(tmp_path, tiny_model, workload, kind):
    with FakeServer(FakeConfig(**FAST)) as srv:
        doc, samples = run_against(srv.base_url, tiny_model, workload, tmp_path, "--no-search", "--concurrency", "4")
    assert doc["config"]["workload_spec"]["kind"] == kind
    fixed = samples[(samples.phase == "fixed") & ~samples.warmup]
    assert len(fixed) == 16 and fixed.ok.all()
    assert fixed.expected_prompt_tokens.nunique() > 3  # the file's own prompts, not one fixed length
    assert (fixed.completion_tokens == fixed.requested_output_tokens).all()
    # the samples folder is queryable as it lies, e.g. by DuckDB over a glob, with no kvbench code
    import duckdb

    glob = str(tmp_path / "**" / "*.requests.parquet")
    n = duckdb.sql(f"select count(*) from read_parquet('{glob}') where phase = 'fixed' and not warmup").fetchall()[0][0]
    assert n == len(fixed)


def test_a_trace_replays_on_its_send_times_without_a_search(tmp_path, tiny_model):
    with FakeServer(FakeConfig(**FAST)) as srv:
        # the bundled trace (trace-small) at a tenth of its replay time: 200 requests over 2.4 s
        doc, samples = run_against(srv.base_url, tiny_model, f"trace:{TRACE},block=64,time_scale=0.05", tmp_path)
    d = doc["dtypes"][0]
    assert [p["kind"] for p in d["phases"]] == ["fixed"]  # its own timing: no SLO probes, no ladder
    assert any("keeps its own timing" in w for w in d["warnings"])
    phase = d["phases"][0]
    assert phase["mode"]["kind"] == "timed"
    fixed = samples[(samples.phase == "fixed") & ~samples.warmup].sort_values("intended_send_s")
    assert len(fixed) == phase["mode"]["requests"] and fixed.ok.all()
    gaps = fixed.intended_send_s.diff().dropna()
    assert gaps.nunique() > 3 and fixed.intended_send_s.iloc[-1] == pytest.approx(phase["mode"]["duration_s"])


def test_multi_turn_sends_each_sessions_turns_in_order_and_caps_sessions(tmp_path, tiny_model):
    with FakeServer(FakeConfig(**FAST)) as srv:
        doc, samples = run_against(
            srv.base_url, tiny_model, "multi-turn:sessions=6,turns=3,user=32,reply=16,think=0.05,concurrent=2", tmp_path
        )
    d = doc["dtypes"][0]
    assert [p["kind"] for p in d["phases"]] == ["fixed"]
    mode = d["phases"][0]["mode"]
    assert mode["kind"] == "sessions" and mode["max_concurrent"] == 2 and mode["sessions"] == 6
    fixed = samples[(samples.phase == "fixed") & ~samples.warmup]
    assert len(fixed) == mode["turns"] and fixed.ok.all()
    # a later turn resends the conversation so far: prompts grow within a session
    assert fixed.expected_prompt_tokens.max() > fixed.expected_prompt_tokens.min() + 32
    # never more than 2 conversations (so requests) in flight at once
    events = sorted([(s, 1) for s in fixed.sent_s] + [(e, -1) for e in fixed.sent_s + fixed.e2e_s])
    level = peak = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    assert peak <= 2
