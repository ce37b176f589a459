"""A CPU run of the user's own model sizes its KV cache from the model and the run (harness/server/kvbudget.py), bounded
by free memory and said in the plan's notes; --kv-cache-memory-bytes wins; the built-in model keeps its 4 MiB.
No vLLM here: the plan is built with the installed vLLM's dtype list stubbed, the sizing checked by arithmetic."""

from __future__ import annotations

import pytest

from kvbench.core.datafiles import load_toml
from kvbench.core.errors import UsageError
from kvbench.harness.run.defaults import build_plan
from kvbench.harness.run.settings import RunSettings
from kvbench.harness.server import kvbudget

CPU = load_toml("run_defaults.toml")["cpu"]
MiB = 2**20


@pytest.fixture(autouse=True)
def _no_vllm_probe(monkeypatch):
    monkeypatch.setattr("kvbench.harness.run.defaults.accepted_kv_dtypes", lambda python: ("auto", "fp8", "nvfp4"))


def plan(tmp_path, **kwargs):
    return build_plan(RunSettings.for_machine(False, results_dir=tmp_path / "results", machine="cpu-test", **kwargs))


def kv_arg(p) -> int:
    args = p.extra_args
    return int(args[args.index("--kv-cache-memory-bytes") + 1])


def test_gqa_model_has_the_other_shape(gqa_model):
    import json

    cfg = json.loads((gqa_model / "config.json").read_text())
    assert cfg["num_key_value_heads"] == 8 and cfg["head_dim"] == 128 and cfg["num_attention_heads"] == 16
    assert cfg["architectures"] == ["Qwen3ForCausalLM"] and (gqa_model / "tokenizer.json").is_file()


def test_bytes_per_sequence_is_whole_cpu_blocks_of_every_layer(gqa_model):
    from kvbench.specs.models import load_model

    spec = load_model(str(gqa_model))
    # 2 layers x (K and V) x 8 KV heads x 128 x 2 bytes = 8 KiB per token; 512 tokens = 4 blocks of 128
    assert kvbudget.bytes_per_sequence(spec, 512) == 512 * 8 * 1024
    assert kvbudget.bytes_per_sequence(spec, 513) == 640 * 8 * 1024  # a partly used block is a whole block


def test_sized_for_the_run_concurrency_then_the_search_cap(gqa_model):
    big = 64 * 2**30
    b = kvbudget.for_run(str(gqa_model), 512, None, [16], 0.5, free_bytes=big)
    assert (b.bytes, b.sequences, b.wanted) == (16 * 4 * MiB, 16, 16)
    assert "the run's concurrency 16" in b.source and "config.json" in b.source
    b = kvbudget.for_run(str(gqa_model), 512, 40, [16], 0.5, free_bytes=big)
    assert (b.bytes, b.sequences) == (40 * 4 * MiB, 40) and "--search-cap" in b.source


def test_bounded_by_free_memory_and_says_so(gqa_model):
    from kvbench.specs.models import load_model

    weights = int(load_model(str(gqa_model)).weight_bytes)
    free = weights + 2 * 42 * MiB  # half of what is left after the weights: 42 MiB, ten 4-MiB sequences
    b = kvbudget.for_run(str(gqa_model), 512, 40, [16], 0.5, free_bytes=free)
    assert (b.bytes, b.sequences, b.wanted) == (10 * 4 * MiB, 10, 40)
    assert "10 sequences, not the 40 wanted" in b.note() and "bounded by 50%" in b.note()
    with pytest.raises(UsageError, match="lower --max-model-len or give --kv-cache-memory-bytes") as exc:
        kvbudget.for_run(str(gqa_model), 512, None, [16], 0.5, free_bytes=weights + 6 * MiB)
    assert "\n" not in str(exc.value)


def test_a_model_without_config_cannot_be_sized(tmp_path):
    with pytest.raises(UsageError, match="give --kv-cache-memory-bytes"):
        kvbudget.for_run(str(tmp_path), 512, None, [16], 0.5, free_bytes=2**34)


def test_run_plan_sizes_the_users_model(tmp_path, gqa_model, monkeypatch):
    monkeypatch.setattr(kvbudget, "free_memory_bytes", lambda: 64 * 2**30)
    p = plan(tmp_path, model=str(gqa_model), kv_dtypes=["auto", "fp8"])
    assert kv_arg(p) == 16 * 4 * MiB  # the CPU default's concurrency 16 at max_model_len 512
    assert p.extra_args.count("--kv-cache-memory-bytes") == 1
    assert any(n.startswith("CPU KV cache: 67,108,864 bytes") and "sized for 16 sequences" in n for n in p.notes)
    p = plan(tmp_path, model=str(gqa_model), search_cap=24, max_model_len=1024)
    assert kv_arg(p) == 24 * 8 * MiB


def test_run_plan_takes_the_flag_or_vllms(tmp_path, gqa_model):
    p = plan(tmp_path, model=str(gqa_model), kv_cache_memory_bytes=123 * MiB)
    assert kv_arg(p) == 123 * MiB and "KV cache: 128,974,848 bytes (--kv-cache-memory-bytes)" in p.notes
    p = plan(tmp_path, model=str(gqa_model), extra_args=["--kv-cache-memory-bytes", "5000000"])
    assert kv_arg(p) == 5_000_000 and p.extra_args.count("--kv-cache-memory-bytes") == 1


def test_builtin_model_keeps_its_fixed_budget(tmp_path):
    p = plan(tmp_path)
    assert kv_arg(p) == CPU["kv_cache_memory_bytes"]


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"kv_cache_memory_bytes": 0}, "--kv-cache-memory-bytes must be a whole number of bytes >= 1, got 0"),
        (
            {"kv_cache_memory_bytes": 10, "extra_args": ["--kv-cache-memory-bytes", "10"]},
            "give --kv-cache-memory-bytes once",
        ),
    ],
)
def test_bad_budget_flags_are_one_line(tmp_path, gqa_model, kwargs, message):
    with pytest.raises(UsageError) as exc:
        plan(tmp_path, model=str(gqa_model), **kwargs)
    assert message in str(exc.value) and "\n" not in str(exc.value)
    assert not (tmp_path / "results").exists()


def test_run_defaults_may_set_the_eval_limit(tmp_path):
    # (beside the budget: the other run default issue 23 adds) absent: every item; the flag wins over the file
    assert plan(tmp_path).eval_limit == CPU.get("eval_limit")
    with_limit = {**CPU, "eval_limit": 200}
    p = build_plan(RunSettings.for_machine(False, defaults=with_limit, results_dir=tmp_path / "r", machine="cpu-test"))
    assert p.eval_limit == 200
    p = build_plan(
        RunSettings.for_machine(
            False, defaults=with_limit, results_dir=tmp_path / "r", machine="cpu-test", eval_limit=7
        )
    )
    assert p.eval_limit == 7
