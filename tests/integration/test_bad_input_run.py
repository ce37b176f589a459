"""`kvbench run` refuses bad input before it measures anything: one line naming the flag, the value and the
valid form, exit 2, nothing written. Zero is never quietly replaced by a default, NaN and infinity are not
numbers, and a results folder that cannot take a record is found before the servers start."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import kvbench_here

from kvbench.core.errors import UsageError
from kvbench.harness.run.defaults import build_plan
from kvbench.harness.run.settings import RunSettings

BAD_PLANS = [
    ({"num_requests": 0}, "--num-requests must be a whole number >= 1, got 0"),
    ({"prompt_tokens": 0}, "--prompt-tokens must be a whole number >= 1, got 0"),
    ({"output_tokens": 0}, "--output-tokens must be a whole number >= 1, got 0"),
    ({"search_cap": 0}, "--search-cap must be a whole number >= 1, got 0"),
    ({"max_model_len": 0}, "--max-model-len must be a whole number >= 1, got 0"),
    ({"stall_timeout_s": 0.0}, "--stall-timeout must be a finite number >= 1 s, got 0"),
    ({"stall_timeout_s": float("inf")}, "--stall-timeout must be a finite number >= 1 s, got inf"),
    ({"startup_timeout_s": float("nan")}, "--startup-timeout must be a finite number > 0 s, got nan"),
    ({"burstiness": float("nan")}, "--burstiness must be a finite number > 0, got nan"),
    ({"rates": [float("nan")]}, "--rate must be a finite number > 0 req/s (or inf), got nan"),
    ({"concurrency": [0]}, "--concurrency must be a whole number >= 1, got 0"),
    ({"search_slo": {"ttft_p95_ms": -5.0}}, "--search-slo ttft_p95_ms must be a finite number > 0 ms, got -5"),
    ({"concurrency": [4], "rates": [2.0]}, "give either --concurrency or --rate, not both"),
    ({"api": "grpc"}, "unknown --api 'grpc'; choose from: completions, chat"),
    ({"kv_dtypes": []}, "--kv-dtypes is empty"),
    ({"accuracy_confidence": 0.5}, "--accuracy-confidence must be a finite number > 0.5 and <= 0.9999, got 0.5"),
    ({"accuracy_confidence": float("nan")}, "--accuracy-confidence must be a finite number > 0.5"),
    ({"accuracy_budget_points": -1.0}, "--accuracy-budget must be a finite number >= 0 and <= 100 points, got -1"),
    ({"prompt_tokens": 500, "output_tokens": 100, "max_model_len": 512}, "exceed max_model_len 512"),
]


@pytest.mark.parametrize("kwargs,message", BAD_PLANS, ids=[m[:40] for _, m in BAD_PLANS])
def test_bad_plans_are_refused_in_one_line(tmp_path, kwargs, message):
    with pytest.raises(UsageError) as exc:
        build_plan(RunSettings.for_machine(False, results_dir=tmp_path / "results", machine="cpu-test", **kwargs))
    assert message in str(exc.value) and "\n" not in str(exc.value)
    assert not (tmp_path / "results").exists()  # nothing written


@pytest.mark.parametrize("where", ["/proc/kvbench-nope", "under-a-file/results"])
def test_an_unwritable_results_folder_is_found_before_measuring(tmp_path, where):
    pytest.importorskip("vllm")
    (tmp_path / "under-a-file").write_text("a file, not a folder")
    target = where if where.startswith("/") else str(tmp_path / where)
    out = kvbench_here("run", "--kv-dtypes", "auto", "--results", target)
    lines = out.stderr.strip().splitlines()
    assert (
        out.returncode == 2 and len(lines) == 1 and "cannot write run records" in lines[0] and "--results" in lines[0]
    )
    assert "Traceback" not in out.stderr and not Path(target).exists()


@pytest.mark.parametrize(
    "args,message",
    [
        (["--num-requests", "0"], "--num-requests must be a whole number >= 1, got 0"),
        (["--rate", "nan"], "--rate needs positive finite numbers"),
        (["--search-slo", "ttft_p95_ms=-5"], "--search-slo ttft_p95_ms must be a finite number > 0 ms"),
        (["--search-slo", "ttft=5"], "must be KEY=NUMBER with KEY one of: ttft_p95_ms, tpot_p95_ms"),
        (["--endpoint", "localhost:8000"], "is not an http(s) URL with a host"),
        (["--api-key", "k"], "--api-key/--header are for --endpoint servers"),
    ],
)
def test_cli_bad_flags_are_one_line(args, message):
    out = kvbench_here("run", *args)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and message in lines[0], out.stderr[-1000:]
