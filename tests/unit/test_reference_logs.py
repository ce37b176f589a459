"""kvbench's capacity from the config alone against every real vLLM start-up log in tests/data/vllm-startup-logs.

For each log: the predicted KV pool per GPU within 0.3 GiB of vLLM's "Available KV cache memory", and
kv_tokens within 1% of "GPU KV cache size" wherever that pool is at least 20 GiB. Logs the model does not
cover yet are expected failures, each with why and the error measured when it was listed.
"""

import tomllib
from pathlib import Path

import pytest
from support import predict_reference_log
from typer.testing import CliRunner

from kvbench.cli.app import app
from kvbench.core.units import GiB

LOGS = Path(__file__).parents[1] / "data" / "vllm-startup-logs"
CASES = tomllib.loads((LOGS / "cases.toml").read_text())
POOL_TOLERANCE_GIB = 0.3
TOKENS_TOLERANCE = 0.01
TOKENS_CHECKED_FROM_GIB = 20

EXPECTED_FAILURES = {
    "google-gemma-3-4b-it--h100-80gb--tp1pp1dp1--8192.txt": (
        "Gemma 3: weights 0.51 GiB over kvbench's count and an unmodelled multimodal profiling peak; pool +0.68 GiB"
    ),
    "google-gemma-3-12b-it--h100-80gb--tp1pp1dp1--8192.txt": (
        "Gemma 3: weights 0.55 GiB over kvbench's count and an unmodelled multimodal profiling peak; pool +0.76 GiB"
    ),
    "google-gemma-3-27b-it--h100-80gb--tp1pp1dp1--8192.txt": (
        "Gemma 3: weights 0.32 GiB over kvbench's count and an unmodelled multimodal profiling peak; pool +0.57 GiB"
    ),
    "other-h100-meta-llama-3-8b-v0.6.5.txt": (
        "V0 (0.6.5) counts non-torch memory from before the "
        "instance (1.79 GiB) and profiles differently; pool +1.84 GiB"
    ),
    "other-a10-8b-v0.txt": (
        "V0 with max_model_len 131072 turns chunked prefill on (smaller profiling batch), not modelled; pool -14.5 GiB"
    ),
    "other-a100-80gb-llama-8b-notes.txt": (
        "a V1 release newer than 0.19 (log lines of another era), scheduler defaults on A100 unknown; pool +0.92 GiB"
    ),
    "other-h100-llava-v1.6-mistral-7b-v0.10.2.txt": (
        "LLaVA-NeXT: the vision encoder's profiling pass over max-size images is not modelled; pool +0.82 GiB"
    ),
    "other-a100-80gb-qwen3-0.6b-v0.10.2.txt": (
        "FlashInfer backend workspace on A100 (vLLM 0.10.2) not modelled; pool -0.32 GiB"
    ),
}


def _cases():
    for path in sorted(LOGS.glob("*.txt")):
        marks = (
            [pytest.mark.xfail(strict=True, reason=EXPECTED_FAILURES[path.name])]
            if path.name in EXPECTED_FAILURES
            else []
        )
        yield pytest.param(path, id=path.stem, marks=marks)


def _predict(path: Path):
    log, (_, _, est, row, _) = predict_reference_log(path, CASES)
    return log, est, row


def test_every_log_is_listed():
    assert len(list(LOGS.glob("*.txt"))) == 43  # 38 llm-d-planner logs + 5 from other sources
    assert set(EXPECTED_FAILURES) <= {p.name for p in LOGS.glob("*.txt")}


@pytest.mark.parametrize("path", list(_cases()))
def test_kv_pool_and_tokens_match_the_log(path):
    log, est, row = _predict(path)
    pool_gib = est.stages[0].kv_pool.bytes / GiB
    assert log.available_kv_gib is not None
    assert abs(pool_gib - log.available_kv_gib) <= POOL_TOLERANCE_GIB, (pool_gib, log.available_kv_gib)
    if log.kv_tokens and log.available_kv_gib >= TOKENS_CHECKED_FROM_GIB:
        assert abs(row.kv_tokens - log.kv_tokens) <= TOKENS_TOLERANCE * log.kv_tokens, (row.kv_tokens, log.kv_tokens)


@pytest.mark.parametrize("path", [pytest.param(p, id=p.stem) for p in sorted(LOGS.glob("*.txt"))])
def test_from_log_prints_the_side_by_side_table(path):
    case = CASES.get(path.name, {})
    args = [
        "capacity",
        "--from-log",
        str(path),
        "--vllm-version",
        case.get("vllm_version", CASES["default_vllm_version"]),
    ]
    for key, flag in (
        ("model", "--model"),
        ("gpu", "--gpu"),
        ("max_model_len", "--context"),
        ("utilization", "--gpu-memory-utilization"),
        ("weights", "--weights"),
    ):
        if key in case:
            args += [flag, str(case[key])]
    out = CliRunner().invoke(app, args, env={"COLUMNS": "250"})
    assert out.exit_code == 0, out.output
    for term in ("weights", "activation peak", "non-torch", "KV pool per GPU", "KV tokens (group)", "error"):
        assert term in out.output


def test_acceptance_llama_8b_h100():
    path = LOGS / "meta-llama-llama-3-1-8b---h100-80gb--tp1pp1dp1--8192.txt"
    log, est, row = _predict(path)
    assert row.kv_tokens == pytest.approx(476_016, rel=0.01)
    tp2 = LOGS / "meta-llama-llama-3-1-8b---h100-80gb--tp2pp1dp1--8192.txt"
    log, est, row = _predict(tp2)
    assert est.tensor_parallel_size == 2 and row.kv_tokens == pytest.approx(1_044_688, rel=0.01)


def test_log_without_capacity_line_is_one_line(tmp_path):
    empty = tmp_path / "log.txt"
    empty.write_bytes(b"INFO starting\n\xff\xfe binary junk\n")
    out = CliRunner().invoke(app, ["capacity", "--from-log", str(empty)])
    assert out.exit_code != 0 and "no KV-cache capacity line" in str(out.exception)


def test_a_gpu_run_records_the_predicted_non_kv_terms_beside_the_servers_log():
    # What `kvbench run` writes to capacity.non_kv on a GPU: the same prediction, next to the log's own figures.
    from kvbench.harness.server.capacitychecks import non_kv_report
    from kvbench.specs.gpus import get_gpu
    from kvbench.specs.models import spec_for

    path = LOGS / "meta-llama-llama-3-1-8b---h100-80gb--tp1pp1dp1--8192.txt"
    report = non_kv_report(
        spec_for("llama-3.1-8b"),
        get_gpu("h100-sxm"),
        {"gpu_memory_utilization": "0.95"},
        8192,
        [],
        CASES["default_vllm_version"],
        path.read_text(),
    )
    stage = report["predicted"]["stages"][0]
    measured = report["measured_from_log"]
    assert stage["weights"]["gib"] == pytest.approx(measured["weights_gib"], abs=0.05)
    assert stage["kv_pool"]["gib"] == pytest.approx(measured["kv_pool_gib"], abs=POOL_TOLERANCE_GIB)
    assert report["predicted"]["tensor_parallel_size"] == 1
    assert "error" in non_kv_report(spec_for("llama-3.1-8b"), get_gpu("h100-sxm"), {}, 8192, [], "0.1.0", None)


def test_a_gpu_runs_prediction_follows_the_servers_own_arguments():
    # A server started with --max-num-seqs, --max-num-batched-tokens or --dtype profiles and loads differently;
    # the run's prediction takes them from the vLLM arguments it started the server with.
    from kvbench.harness.server.capacitychecks import non_kv_report
    from kvbench.specs.gpus import get_gpu
    from kvbench.specs.models import spec_for

    def stage(args):
        report = non_kv_report(spec_for("llama-3.1-8b"), get_gpu("h100-sxm"), {}, 8192, args, "0.19.0", None)
        return report["predicted"]["stages"][0]

    default = stage([])
    small = stage(["--max-num-seqs", "8", "--max-num-batched-tokens=1024"])
    assert small["activation"]["gib"] < default["activation"]["gib"]
    assert stage(["--dtype", "float32"])["weights"]["gib"] == pytest.approx(2 * default["weights"]["gib"], rel=0.01)
    assert stage(["--dtype", "auto"]) == default
