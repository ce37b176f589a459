"""Fidelity per token against the fake server (harness/quality/fidelity.py): vLLM's prompt_logprobs shape, the floor
(auto at load vs auto at rest) at zero where nothing changes, a dtype that changes under load measured as
such, and one Parquet row per item and condition."""

from __future__ import annotations

import asyncio

import pyarrow.parquet as pq
import pytest

from kvbench.harness.quality import fidelity
from kvbench.records import SampleStore
from kvbench.testing.fakeserver import FakeServer
from kvbench.testing.fakestate import FakeConfig


@pytest.fixture(scope="module")
def tok(trained_model):
    from kvbench.core.tokenizer import load_tokenizer

    return load_tokenizer(trained_model)


def test_fake_server_answers_prompt_logprobs_in_vllms_shape():
    import json
    import urllib.request

    with FakeServer(FakeConfig(ttft_s=0.001)) as srv:
        body = {"model": "kvbench-fake", "prompt": [5, 9, 11], "max_tokens": 1, "prompt_logprobs": 3}
        req = urllib.request.Request(
            srv.base_url + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        choice = json.load(urllib.request.urlopen(req))["choices"][0]
    rows = choice["prompt_logprobs"]
    assert len(rows) == 3 and rows[0] is None  # vLLM: one entry per prompt token, the first has no context
    for row, token in zip(rows[1:], (9, 11), strict=True):
        assert str(token) in row  # the prompt's own token is always there, beside the top k
        assert {"logprob", "rank", "decoded_token"} <= set(row[str(token)])
        assert sum(1 for v in row.values() if v["rank"] <= 3) == 3


def test_floor_is_zero_and_a_dtype_that_changes_under_load_is_measured(tok, tmp_path):
    store = SampleStore("run-x")
    fid = fidelity.Fidelity(tok, ["kvbench_needle_512", "gsm8k"], per_task=4, k=5)
    assert len(fid.items) == 4  # lm-eval's own tasks cannot be rebuilt: kvbench's only
    with FakeServer(FakeConfig(ttft_s=0.03)) as srv:
        auto = asyncio.run(fid.measure(srv.base_url, "kvbench-fake", "auto", 4, samples=store))
        assert set(auto) == {"load"}  # auto at rest is the reference; auto at load is the floor
        floor = auto["load"]
        assert floor["mean_kld"] == 0.0 and floor["top1_agreement"] == 1.0 and floor["items"] == 4
        assert floor["tokens"] == sum(len(it["cont_ids"]) for it in fid.items)
        assert floor["method"].startswith("top-5 logprobs") and "lower bound" in floor["method"]
        srv.configure(corrupt_above=2)  # wrong whenever 2+ requests are in flight: at load, not at rest
        fp8 = asyncio.run(fid.measure(srv.base_url, "kvbench-fake", "fp8", 4, samples=store))
    assert fp8["rest"]["mean_kld"] == 0.0 and fp8["rest"]["mean_kld_ci"] == [0.0, 0.0]
    load = fp8["load"]
    assert load["mean_kld"] > 0.01 and load["top1_agreement"] < 1.0 and load["p99_kld"] > 0
    for key in ("mean_kld_ci", "top1_agreement_ci", "s_per_item", "concurrency", "positions"):
        assert load[key] is not None
    assert load["concurrency"] == 4
    ref = store.write(tmp_path / "run-x.json")
    assert ref.fidelity_rows == 4 * 3  # auto load, fp8 rest and load
    table = pq.read_table(tmp_path / ref.fidelity).to_pandas()
    assert set(table["condition"]) == {"rest", "load"} and set(table["kv_cache_dtype"]) == {"auto", "fp8"}
    assert (table["tokens"] > 0).all()


def test_rest_scores_every_item_and_load_the_first_of_each_task(tok):
    """At rest every item (the eval's items at rest), at load the first load_per_task of each task: the rows
    compared at load are rest's own items (their reference is auto at rest on the same item), and the progress
    callback sees each condition's count from 0 to the end."""
    tasks = ["kvbench_needle_512", "kvbench_track_512"]
    fid = fidelity.Fidelity(tok, tasks, per_task=5, k=5, load_per_task=2)
    assert fid.condition_items("rest") == list(range(10))
    assert fid.condition_items("load") == [0, 1, 5, 6]  # the first two of each task, in the items' order
    seen: dict[str, list[int]] = {}
    fid.on_progress = lambda cond, done, total: seen.setdefault(cond, []).append((done, total))
    with FakeServer(FakeConfig(ttft_s=0.005)) as srv:
        asyncio.run(fid.measure(srv.base_url, "kvbench-fake", "auto", 3))
        fp8 = asyncio.run(fid.measure(srv.base_url, "kvbench-fake", "fp8", 3))
    assert fp8["rest"]["items"] == 10 and fp8["load"]["items"] == 4
    # the same answers everywhere: zero only if load's items meet auto's rest scores of the same items (4 items
    # against the first four references would compare other sequences, or fail on their lengths)
    assert fp8["load"]["mean_kld"] == 0.0 and fp8["load"]["top1_agreement"] == 1.0
    assert seen["rest"][0] == (0, 10) and seen["rest"][-1] == (10, 10)
    assert seen["load"][0] == (0, 4) and seen["load"][-1] == (4, 4)


def test_the_gold_answer_is_scored_on_the_load_items_only(tok):
    """Where auto's answer is not the gold one, prompt + gold is a second request: made for the load condition's
    items only (each item at rest would add ~15% to the phase); the others' gold Δ log p is missing, never taken
    from auto's own answer."""
    fid = fidelity.Fidelity(tok, ["kvbench_needle_512"], per_task=6, k=5, load_per_task=2)
    with FakeServer(FakeConfig(ttft_s=0.002)) as srv:
        asyncio.run(fid.measure(srv.base_url, "kvbench-fake", "auto", 2))
    wrong = [i for i, it in enumerate(fid.items) if it["cont_ids"][: len(it["gold_ids"])] != it["gold_ids"]]
    assert wrong, "the fake's answers must miss some gold answers for this test to mean anything"
    scored = {i for i, r in enumerate(fid.reference) if r["gold"] is not None}
    assert scored == {i for i in wrong if i < 2}
    rows = fidelity.compare(fid.items, fid.reference, fid.reference)
    assert all(rows[i]["gold_dlogp"] is None for i in wrong if i >= 2)
    assert all(rows[i]["gold_dlogp"] == 0.0 for i in range(6) if i < 2 or i not in wrong)
