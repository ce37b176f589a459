"""kvbench's emulated KV stores, byte for byte against vLLM's own store code (kernels/bitexact.py).

vLLM's Triton store kernels run from the installed package under Triton's interpreter (kernels/vllm_triton_cpu.py
says why that needs three assignments). TRITON_INTERPRET=1 must be set before triton is first imported, and in a
full pytest session vLLM or transformers import it first, so unless this process already interprets, one test
re-runs this file in a fresh process with it set (as tests/integration/test_triton_kernels.py does).

nvfp4 / nvfp4_4over6 are not here: vLLM's writer is CUDA-only (FlashInfer nvfp4_kv_quantize, SM100+), so they
keep kvbench's independent oracle (tests/unit/test_nvfp4.py, tests/unit/test_vllm_crosscheck.py).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

HERE = os.path.abspath(__file__)
if "triton" not in sys.modules and os.environ.get("KVBENCH_TRITON_CHILD") == "1":
    os.environ["TRITON_INTERPRET"] = "1"
RUN_HERE = os.environ.get("TRITON_INTERPRET") == "1" and not torch.cuda.is_available()
here_only = pytest.mark.skipif(not RUN_HERE, reason="runs in the TRITON_INTERPRET=1 child process")
pytest.importorskip("vllm")


@pytest.mark.skipif(RUN_HERE, reason="this process runs the comparisons itself")
def test_bit_for_bit_under_the_triton_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1", "KVBENCH_TRITON_CHILD": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", HERE, "-q", "-p", "no:cacheprovider", "-x"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    summary = out.stdout.strip().splitlines()[-1]
    assert "failed" not in summary and int(summary.split(" passed")[0].split()[-1]) >= 15, summary


if RUN_HERE:
    from kvbench.kernels import bitexact, codecs, ultraquant, vllm_triton_cpu

    vllm_triton_cpu.enable()
    DTYPES = list(bitexact.RUNNERS)
else:
    DTYPES = []


@here_only
@pytest.mark.parametrize("head_size", [32, 64])  # the tiny model's, and a second width
@pytest.mark.parametrize("dtype", DTYPES)
def test_kvbench_store_equals_vllms(dtype, head_size):
    result = bitexact.compare(dtype, head_size=head_size)
    assert result.bytes_compared > 0
    if dtype.startswith(("turboquant", "ultraquant")):  # vLLM ships a full-dequant kernel for these
        assert result.decoded_compared > 0
    assert not result.unexplained, [m.__dict__ for m in result.unexplained[:5]]
    # fp8 bytes are the only ones the interpreter's cast may get wrong; int8 and 4-bit codes are integer math
    if "fp8" not in dtype and dtype != "turboquant_k8v4":
        assert not result.mismatches


@here_only
def test_the_interpreters_fp8_cast_is_what_the_classifier_blames():
    # the trap (/work/shared/notes/vllm-triton-on-cpu.md): rounding that carries into the exponent halves the value
    got = vllm_triton_cpu.interpreter_e4m3(torch.tensor([124.3, 120.0, 447.0]))
    rne = torch.tensor([124.3, 120.0, 447.0]).to(torch.float8_e4m3fn).view(torch.uint8)
    as_float = got.view(torch.float8_e4m3fn).float().tolist()
    if as_float[0] == 128.0:
        pytest.skip("this Triton's interpreter casts to fp8 correctly (PR 11897 landed): nothing to classify")
    assert as_float == [64.0, 120.0, 448.0] and rne.view(torch.float8_e4m3fn).float().tolist() == [128.0, 120.0, 448.0]
    result = bitexact.compare("fp8_per_token_head")
    assert result.mismatches, "the sample has carries: the interpreter should have got some wrong"
    for m in result.mismatches:
        assert m.cause == bitexact.INTERPRETER_CAST and m.value is not None
        # the GPU's (round-to-nearest-even, saturating) byte is kvbench's
        assert int(torch.tensor([m.value]).to(torch.float8_e4m3fn).view(torch.uint8)) == m.kvbench


def _plant_one_bit(store):
    def flipped(pages, key, value, slot_mapping, scales):
        store(pages, key, value, slot_mapping, scales)
        blk, off = codecs.rows(slot_mapping[:1], pages.shape[2])
        codecs.byte_view(pages)[blk, 0, off, 5] ^= 0x04

    return flipped


@here_only
@pytest.mark.parametrize(
    "dtype", ["int8_per_token_head", "fp8_per_token_head", "turboquant_3bit_nc", "ultraquant_4bit"]
)
def test_a_planted_one_bit_change_fails(dtype):
    result = bitexact.compare(dtype, store=_plant_one_bit)
    bad = result.unexplained
    assert [(m.part, m.token, m.head, m.index) for m in bad if m.part == "page bytes"] == [("page bytes", 0, 0, 5)]
    assert int(bad[0].kvbench) ^ int(bad[0].vllm) == 0x04


@here_only
def test_vllms_ultraquant_reference_is_not_its_store_kernel():
    """A finding about vLLM: ultraquant/reference.py calls itself the kernels' bit-comparison ground truth, but it
    rotates K by x @ H.T where the store kernel runs a butterfly with a 1/sqrt(2) rounding per stage; a rotated
    value on an FP4 midpoint (1.25 exactly vs 1.2500001) then gets another code. kvbench follows the kernel,
    which is what the engine runs."""
    from vllm.v1.attention.ops.ultraquant.reference import ultraquant_encode
    from vllm.v1.attention.ops.ultraquant.triton_store import ultraquant_store

    g = torch.Generator().manual_seed(1)
    for d in (32, 64):  # the search that found it drew a D=32 batch first
        x = (torch.randn(64, 4, d, generator=g) * torch.rand(64, 4, 1, generator=g) * 5).bfloat16()
    # the reference over the whole batch (its matmul's rounding depends on the batch's shape, another way the
    # reference is not the per-row kernel); the row docs/guide/emulated-dtypes.md names
    enc = ultraquant_encode(x, rotate=True)
    reference = torch.cat((enc.codes_packed, enc.scale_bytes), -1)[27, 3]
    row = x[27, 3].view(1, 1, 64)
    cache = torch.zeros(1, 16, 1, 68, dtype=torch.uint8)
    ultraquant_store(row, torch.zeros_like(row), cache, torch.tensor([0]))
    kernel = cache[0, 0, 0, :34]
    ours = ultraquant.encode(ultraquant.rotate(row)).reshape(-1)
    assert torch.equal(ours, kernel)
    assert (reference != kernel).nonzero().flatten().tolist() == [4]
    assert (int(kernel[4]), int(reference[4])) == (0xB5, 0xC5)  # element 9, -1.75 rotated: -1.5 (kernel) vs -2
