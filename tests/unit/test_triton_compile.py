"""The Triton kernels compile for real GPUs (SM80 = A100, SM90 = H100/H200), checked without a GPU.

Triton's wheel ships ptxas, so kernels can be compiled ahead of time for a target: this catches what the
interpreter cannot (layouts, dtype support per architecture). It also pins the reason for the portable
E4M3 decode: native fp8e4nv does not compile for SM80.
"""

import os
from pathlib import Path

import pytest

if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.skip("kernels are interpreted in this process; nothing to compile", allow_module_level=True)

triton = pytest.importorskip("triton")
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

if not (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").exists():
    pytest.skip("this triton has no bundled ptxas", allow_module_level=True)

from kvbench.kernels import decode_attention as da  # noqa: E402
from kvbench.kernels import paged_cache as pc  # noqa: E402

CACHE_T = {"fp16": "*fp16", "bf16": "*bf16"}


@pytest.fixture(autouse=True)
def _fp_fusion(monkeypatch):
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, without its warning


def compile_decode(
    cap, fmt, mode, head_dim=128, group=4, variant=0, deq=0, tile_n=64, num_warps=4, num_stages=3, fma=False
):
    qdt = "bf16" if fmt == "bf16" else "fp16"
    sig = {
        "q_ptr": f"*{qdt}",
        "cache_ptr": CACHE_T.get(fmt, "*u8"),
        "block_table_ptr": "*i32",
        "seq_lens_ptr": "*i32",
        "m_ptr": "*fp32",
        "l_ptr": "*fp32",
        "acc_ptr": "*fp32",
        "qk_scale": "fp32",
        "stride_qb": "i32",
        "stride_qh": "i32",
        "stride_bt": "i32",
        "max_parts": "i32",
        "partition": "i32",
    }
    consts = {
        "FMT": pc._FMT_CODE[fmt],
        "FP8_DECODE": mode,
        "HKV": 8,
        "GROUP": group,
        "GROUP_PAD": group if fma else max(16, group),
        "T": 16,
        "D": head_dim,
        "TILE_N": tile_n,
        "UPCAST": 2 if fma else 0,
        "VARIANT": variant,
        "DEQ": deq,
    }
    sig |= {k: "constexpr" for k in consts}
    return triton.compile(
        ASTSource(da._decode_partition_kernel, sig, consts),
        target=GPUTarget("cuda", cap, 32),
        options={"num_warps": num_warps, "num_stages": num_stages},
    )


def compile_write(cap, fmt, enc=0):
    qdt = "bf16" if fmt == "bf16" else "fp16"
    sig = {
        "key_ptr": f"*{qdt}",
        "value_ptr": f"*{qdt}",
        "cache_ptr": CACHE_T.get(fmt, "*u8"),
        "slot_ptr": "*i64",
        "k_enc": "fp32",
        "k_scale": "fp32",
        "v_enc": "fp32",
        "v_scale": "fp32",
        "stride_kt": "i32",
        "stride_kh": "i32",
        "stride_vt": "i32",
        "stride_vh": "i32",
    }
    consts = {"FMT": pc._FMT_CODE[fmt], "H": 8, "HP": 8, "T": 16, "D": 128, "ENC": enc}
    sig |= {k: "constexpr" for k in consts}
    return triton.compile(ASTSource(pc._reshape_and_cache_kernel, sig, consts), target=GPUTarget("cuda", cap, 32))


def compile_reduce(cap):
    sig = {
        "m_ptr": "*fp32",
        "l_ptr": "*fp32",
        "acc_ptr": "*fp32",
        "seq_lens_ptr": "*i32",
        "out_ptr": "*fp16",
        "v_scale": "fp32",
        "max_parts": "i32",
        "partition": "i32",
        "stride_ob": "i32",
        "stride_oh": "i32",
        "HQ": "constexpr",
        "D": "constexpr",
    }
    return triton.compile(
        ASTSource(da._decode_reduce_kernel, sig, {"HQ": 32, "D": 128}), target=GPUTarget("cuda", cap, 32)
    )


def default_mode(cap):
    return 1 if cap >= 89 else 2  # what decode_attention.default_fp8_decode picks on that GPU


@pytest.mark.parametrize("cap", [80, 90])
@pytest.mark.parametrize("fmt", ["fp16", "bf16", "fp8", "fp8_e5m2", "nvfp4"])
def test_kernels_compile_for_ampere_and_hopper(cap, fmt):
    k = compile_decode(cap, fmt, default_mode(cap))
    assert k.asm["cubin"] and k.metadata.shared < 100 * 1024
    assert compile_write(cap, fmt).asm["cubin"]


def test_reduce_and_integer_decode_compile_everywhere():
    for cap in (80, 90):
        assert compile_reduce(cap).asm["cubin"]
        assert compile_decode(cap, "nvfp4", 0, head_dim=64, group=8).asm["cubin"]


def test_native_e4m3_is_refused_below_sm89_which_is_why_the_decode_is_portable():
    with pytest.raises(Exception) as info:
        compile_decode(80, "fp8", 1)
    chain, exc = [], info.value
    while exc is not None:  # Triton wraps the cause in CompilationErrors, one per call level
        chain.append(str(exc))
        exc = exc.__cause__ or exc.__context__
    assert any("fp8e4nv" in text and "not supported" in text for text in chain), chain[-1][-500:]


@pytest.mark.parametrize("fmt", ["fp16", "fp8", "nvfp4"])
def test_cost_variants_and_candidates_compile_for_hopper(fmt):
    # what kernels/sweep.py launches on an H100/H200: the two cost-isolating variants, and the candidate
    # configurations at their extremes (f16 dequant, TILE_N 128 with 8 warps and 1 or 3 stages)
    for variant in (1, 2):
        assert compile_decode(90, fmt, 1, variant=variant).asm["cubin"]
    deq = 1 if fmt == "nvfp4" else 0
    for stages in (1, 3):
        k = compile_decode(90, fmt, 1, deq=deq, tile_n=128, num_warps=8, num_stages=stages)
        assert k.asm["cubin"] and k.metadata.shared < 228 * 1024
    assert compile_write(90, fmt, enc=1).asm["cubin"]
    assert compile_decode(90, fmt, 1, deq=deq, num_warps=8, fma=True).asm["cubin"]  # the fma candidate
