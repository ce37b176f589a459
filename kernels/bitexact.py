"""Bit for bit: each emulated store of kvbench against vLLM's own store code, on the same K/V.

For every cache dtype kvbench stores in vLLM's pages itself (kernels/codecs.py), `compare(dtype)` writes the same
bf16 K/V through kvbench's store and through the code vLLM 0.32 runs for that dtype -- its Triton store kernels,
run by Triton's interpreter from the installed package (kernels/vllm_triton_cpu.py), or its torch reference --
and compares the page bytes of every written (token, head) row, and the decoded values where vLLM ships a
decoder. Nothing of vLLM's code is copied: the layout views and the per-layer tables (rotation, codebook) are
built by vLLM's own backend code where that code runs on a CPU.

A mismatch is classified: an fp8 byte whose float32 input the interpreter's own cast turns into vLLM's byte while
round-to-nearest-even gives kvbench's is the interpreter's defect (triton-lang/triton PR 11897), not vLLM's and
not kvbench's; every other mismatch is unexplained and fails the test. nvfp4's writer is CUDA-only (FlashInfer
`nvfp4_kv_quantize`, SM100+): it is checked against kvbench's independent oracle instead (ORACLE_ONLY).
Run `python -m kvbench.kernels.bitexact` under TRITON_INTERPRET=1 for the table the docs quote.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kvbench.kernels import codecs, per_token_head, turboquant, ultraquant, vllm_triton_cpu

INTERPRETER_CAST = "Triton interpreter's fp32->fp8 cast (carry lost; triton PR 11897): a GPU writes kvbench's byte"
UNEXPLAINED = "unexplained"
ORACLE_ONLY = {
    "nvfp4": "CUDA-only in vLLM (FlashInfer nvfp4_kv_quantize, SM100+); kvbench's independent oracle: "
    "tests/unit/test_nvfp4.py, tests/unit/test_vllm_crosscheck.py",
    "nvfp4_4over6": "CUDA-only in vLLM (FlashInfer nvfp4_kv_quantize with 4over6, SM100+); kvbench's oracle: "
    "tests/unit/test_nvfp4.py",
}
BLOCKS, BLOCK_SIZE = 4, 16


@dataclass
class Mismatch:
    part: str  # "page bytes", "decoded K", "decoded V"
    token: int
    head: int
    index: int  # byte or element within the row
    kvbench: float
    vllm: float
    cause: str = UNEXPLAINED
    value: float | None = None  # the float32 value before an fp8 cast


@dataclass
class Result:
    dtype: str
    oracle: str
    bytes_compared: int = 0
    decoded_compared: int = 0
    mismatches: list[Mismatch] = field(default_factory=list)

    @property
    def unexplained(self) -> list[Mismatch]:
        return [m for m in self.mismatches if m.cause == UNEXPLAINED]

    def summary(self) -> str:
        if not self.mismatches:
            verdict = "match"
        elif not self.unexplained:
            verdict = f"match but for {len(self.mismatches)} interpreter fp8 casts"
        else:
            verdict = f"MISMATCH: {len(self.unexplained)} unexplained"
        return (
            f"{self.dtype}: {verdict} ({self.bytes_compared} page bytes, {self.decoded_compared} decoded values; "
            f"vs {self.oracle})"
        )


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------


def sample(tokens: int = 20, heads: int = 2, head_size: int = 64, seed: int = 0):
    """bf16 K and V [tokens + 1, heads, D] (the last token is padding, slot -1), and the slots: distinct, random,
    across BLOCKS pages of BLOCK_SIZE. Keys get an outlier channel, as real keys have; values a wide range."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(tokens + 1, heads, head_size, generator=g)
    k[..., 3] *= 8.0
    v = torch.randn(tokens + 1, heads, head_size, generator=g) * torch.rand(tokens + 1, heads, 1, generator=g) * 4
    slots = torch.randperm(BLOCKS * BLOCK_SIZE, generator=g)[: tokens + 1]
    slots[-1] = -1
    return k.bfloat16(), v.bfloat16(), slots.long()


def _pages(codec: codecs.Codec, heads: int, head_size: int, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    """Zeroed pages [BLOCKS, heads, BLOCK_SIZE, content] as the CPU backend holds them (HND, contiguous)."""
    width = codec.layout(head_size).content_bytes
    return torch.zeros(BLOCKS, heads, BLOCK_SIZE, width, dtype=dtype)


def _rows(pages: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    blk, off = codecs.rows(slots, BLOCK_SIZE)
    return codecs.byte_view(pages)[blk, :, off]


def _compare_bytes(result: Result, ours: torch.Tensor, theirs: torch.Tensor, precast: torch.Tensor | None) -> None:
    """Record every differing byte of [T, H, C] rows; an fp8 byte (precast not NaN) is checked against the
    interpreter's own cast of its float32 input."""
    result.bytes_compared += ours.numel()
    for t, h, i in (ours != theirs).nonzero().tolist():
        m = Mismatch("page bytes", t, h, i, int(ours[t, h, i]), int(theirs[t, h, i]))
        if precast is not None and not torch.isnan(precast[t, h, i]):
            m.value = float(precast[t, h, i])
            rne = int(precast[t, h, i : i + 1].to(torch.float8_e4m3fn).view(torch.uint8))
            interp = int(vllm_triton_cpu.interpreter_e4m3(precast[t, h, i : i + 1]))
            if interp == m.vllm and rne == m.kvbench:
                m.cause = INTERPRETER_CAST
        result.mismatches.append(m)


def _compare_decoded(result: Result, part: str, ours: torch.Tensor, theirs: torch.Tensor) -> None:
    result.decoded_compared += ours.numel()
    differ = (ours != theirs) & ~(torch.isnan(ours) & torch.isnan(theirs))
    for t, h, i in differ.nonzero().tolist():
        result.mismatches.append(Mismatch(part, t, h, i, float(ours[t, h, i]), float(theirs[t, h, i])))


# ---------------------------------------------------------------------------------------------
# Per-token-head: vLLM's Triton backend store
# ---------------------------------------------------------------------------------------------


def _per_token_head(dtype: str, k, v, slots) -> Result:
    from vllm.platforms import current_platform
    from vllm.v1.attention.backends.triton_attn import TritonAttentionImpl
    from vllm.v1.attention.ops.triton_reshape_and_cache_flash import (
        triton_reshape_and_cache_flash_per_token_head_quant,
    )
    from vllm.v1.kv_cache_interface import get_kv_quant_mode

    class Views:  # TritonAttentionImpl's own view code (scales carved from the rows), without a whole layer
        _ensure_scale_caches = TritonAttentionImpl._ensure_scale_caches
        _pth_key_value_caches = TritonAttentionImpl._pth_key_value_caches
        _k_scale_cache = _v_scale_cache = None
        _kv_quant_mode = get_kv_quant_mode(dtype)
        fp8_dtype = current_platform.fp8_dtype()

    codec = codecs.get(dtype)
    heads, d = k.shape[1], k.shape[2]
    page_dtype = torch.int8 if dtype == "int8_per_token_head" else torch.uint8  # STR_DTYPE_TO_TORCH_DTYPE
    theirs, ours = _pages(codec, heads, d, page_dtype), _pages(codec, heads, d, page_dtype)
    views = Views()
    key_cache, value_cache = views._pth_key_value_caches(theirs)
    triton_reshape_and_cache_flash_per_token_head_quant(
        k,
        v,
        key_cache,
        value_cache,
        views._k_scale_cache,
        views._v_scale_cache,
        slots,
        kv_quant_mode=views._kv_quant_mode,
    )
    keep = slots >= 0
    codec.store(ours, k[keep], v[keep], slots[keep], codecs.Scales())
    result = Result(dtype, "vLLM's triton_reshape_and_cache_flash_per_token_head_quant, Triton interpreter")
    precast = None
    if dtype == "fp8_per_token_head":  # the float32 values the kernel casts to fp8, as kvbench computes them
        precast = torch.full(_rows(ours, slots[keep]).shape, float("nan"))
        for side, x in enumerate((k[keep], v[keep])):
            x = x.float()
            scale = torch.clamp_min(x.abs().amax(-1) / 448.0, per_token_head.SCALE_FLOOR)
            start = side * (d + 4)
            precast[..., start : start + d] = (x * (1.0 / scale).unsqueeze(-1)).clamp(-448.0, 448.0)
    _compare_bytes(result, _rows(ours, slots[keep]), _rows(theirs, slots[keep]), precast)
    return result


# ---------------------------------------------------------------------------------------------
# TurboQuant: vLLM's fused Triton store, and its full-dequant kernel for the decoded values
# ---------------------------------------------------------------------------------------------


def _turboquant(dtype: str, k, v, slots) -> Result:
    from types import SimpleNamespace

    from vllm.model_executor.layers.quantization.turboquant.config import TurboQuantConfig
    from vllm.v1.attention.backends.turboquant_attn import TurboQuantAttentionImpl
    from vllm.v1.attention.ops.triton_turboquant_decode import _tq_full_dequant_kv, _use_fp8_e4b15
    from vllm.v1.attention.ops.triton_turboquant_store import triton_turboquant_store

    codec = codecs.get(dtype)
    heads, d = k.shape[1], k.shape[2]
    cfg = TurboQuantConfig.from_cache_dtype(dtype, d)
    # the backend's own derivation of the layer's tables (_tq_PiT, _tq_midpoints, _tq_centroids)
    impl = SimpleNamespace(_soa_store=False, head_size=d, tq_config=cfg)
    layer = SimpleNamespace()
    TurboQuantAttentionImpl._ensure_on_device(impl, layer, torch.device("cpu"))
    theirs, ours = _pages(codec, heads, d), _pages(codec, heads, d)
    nhd = theirs.transpose(1, 2)  # the backend's (B, H, N, C) -> (B, N, H, C)
    triton_turboquant_store(
        k,
        v,
        nhd,
        slots.int(),
        layer._tq_PiT,
        layer._tq_midpoints,
        mse_bits=cfg.key_mse_bits,
        key_packed_size=cfg.key_packed_size,
        value_quant_bits=cfg.effective_value_quant_bits,
        key_fp8=cfg.key_fp8,
    )
    keep = slots >= 0
    codec.store(ours, k[keep], v[keep], slots[keep], codecs.Scales())
    fp8_path = "e4b15" if _use_fp8_e4b15(0) else "e4nv"
    result = Result(dtype, f"vLLM's triton_turboquant_store + _tq_full_dequant_kv, Triton interpreter (fp8 {fp8_path})")
    precast = None
    if cfg.key_fp8:
        precast = torch.full(_rows(ours, slots[keep]).shape, float("nan"))
        precast[..., :d] = k[keep].float().clamp(-448.0, 448.0)
    _compare_bytes(result, _rows(ours, slots[keep]), _rows(theirs, slots[keep]), precast)

    # decoded: vLLM's full dequant of its own pages vs kvbench's decode of the same bytes (rotated basis, fp16)
    positions = BLOCKS * BLOCK_SIZE
    k_out = torch.zeros(1, heads, positions, d, dtype=torch.float16)
    v_out = torch.zeros_like(k_out)
    table = torch.arange(BLOCKS, dtype=torch.int32).unsqueeze(0)
    _tq_full_dequant_kv[(positions, heads)](
        nhd, table, layer._tq_centroids, k_out, v_out,
        *k_out.stride()[:3], *v_out.stride()[:3], *nhd.stride()[:3], table.stride(0),
        HEAD_DIM=d, BLOCK_SIZE=BLOCK_SIZE, NUM_KV_HEADS=heads, MSE_BYTES=-(-d * cfg.key_mse_bits // 8),
        KPS=cfg.key_packed_size, VQB=cfg.effective_value_quant_bits,
        VAL_DATA_BYTES=-(-d * cfg.effective_value_quant_bits // 8), MSE_BITS=cfg.key_mse_bits,
        KEY_FP8=1 if cfg.key_fp8 else 0, BLOCK_D=d, NORM_CORRECTION=1 if cfg.norm_correction else 0,
        FP8_E4B15=_use_fp8_e4b15(0),
    )  # fmt: skip
    k_rot, v_dec = turboquant.decode_rows_rotated(_rows(theirs, slots[keep]), dtype, d)
    written = slots[keep]
    _compare_decoded(result, "decoded K", k_rot, k_out[0, :, written].transpose(0, 1))
    _compare_decoded(result, "decoded V", v_dec, v_out[0, :, written].transpose(0, 1))
    return result


# ---------------------------------------------------------------------------------------------
# UltraQuant: vLLM's Triton store and dequant, and its torch reference
# ---------------------------------------------------------------------------------------------


def _ultraquant(dtype: str, k, v, slots) -> Result:
    from vllm.v1.attention.ops.ultraquant.triton_dequant import ultraquant_full_dequant_kv
    from vllm.v1.attention.ops.ultraquant.triton_store import ultraquant_store

    codec = codecs.get(dtype)
    heads, d = k.shape[1], k.shape[2]
    theirs, ours = _pages(codec, heads, d), _pages(codec, heads, d)
    nhd = theirs.transpose(1, 2)
    ultraquant_store(k, v, nhd, slots)
    keep = slots >= 0
    codec.store(ours, k[keep], v[keep], slots[keep], codecs.Scales())
    result = Result(dtype, "vLLM's ultraquant_store + ultraquant_full_dequant_kv, Triton interpreter")
    _compare_bytes(result, _rows(ours, slots[keep]), _rows(theirs, slots[keep]), None)

    positions = BLOCKS * BLOCK_SIZE
    k_out = torch.zeros(1, heads, positions, d, dtype=torch.float16)
    v_out = torch.zeros_like(k_out)
    ultraquant_full_dequant_kv(nhd, torch.arange(BLOCKS, dtype=torch.int32).unsqueeze(0), k_out, v_out, positions)
    k_rot, v_dec = ultraquant.decode_rows_rotated(_rows(theirs, slots[keep]), d)
    written = slots[keep]
    _compare_decoded(result, "decoded K", k_rot.half(), k_out[0, :, written].transpose(0, 1))
    _compare_decoded(result, "decoded V", v_dec.half(), v_out[0, :, written].transpose(0, 1))
    return result


def ultraquant_reference(k, v) -> Result:
    """kvbench's ultraquant bytes vs vLLM's torch reference (`ultraquant_encode`/`ultraquant_dequant`), which
    reference.py calls the kernels' bit-comparison ground truth. It rotates K by x @ H.T, the store kernel by a
    butterfly, so the two can differ where a rotated value sits on a rounding edge: a finding about vLLM."""
    from vllm.v1.attention.ops.ultraquant.reference import ultraquant_dequant, ultraquant_encode

    d = k.shape[-1]
    result = Result("ultraquant_4bit", "vLLM's ultraquant/reference.py (torch)")
    for part, x, rotate in (("K", k, True), ("V", v, False)):
        enc = ultraquant_encode(x, rotate=rotate)
        theirs = torch.cat((enc.codes_packed, enc.scale_bytes), dim=-1)
        ours = ultraquant.encode(ultraquant.rotate(x) if rotate else x)
        _compare_bytes(result, ours, theirs, None)
        _compare_decoded(result, f"decoded {part}", ultraquant.decode(theirs, d), ultraquant_dequant(enc, d))
    return result


RUNNERS = {
    "int8_per_token_head": _per_token_head,
    "fp8_per_token_head": _per_token_head,
    "int4_per_token_head": _per_token_head,
    **{p: _turboquant for p in turboquant.PRESETS},
    "ultraquant_4bit": _ultraquant,
}


def compare(dtype: str, head_size: int = 64, seed: int = 0, store=None) -> Result:
    """One dtype's comparison (vllm_triton_cpu.enable() first). `store` replaces kvbench's store (the planted
    one-bit change in the tests)."""
    k, v, slots = sample(head_size=head_size, seed=seed)
    if store is None:
        return RUNNERS[dtype](dtype, k, v, slots)
    codec = codecs.get(dtype)
    original = codecs._REGISTRY[dtype]
    codecs._REGISTRY[dtype] = codecs.Codec(**{**codec.__dict__, "store": store(codec.store)})
    try:
        return RUNNERS[dtype](dtype, k, v, slots)
    finally:
        codecs._REGISTRY[dtype] = original


def main() -> None:
    vllm_triton_cpu.enable()
    for dtype in RUNNERS:
        for d in (32, 64):
            print(f"D={d} {compare(dtype, head_size=d).summary()}")
    k, v, _ = sample()
    print(f"D=64 {ultraquant_reference(k[:-1], v[:-1]).summary()}")
    for dtype, why in ORACLE_ONLY.items():
        print(f"{dtype}: not compared with vLLM: {why}")


if __name__ == "__main__":
    main()
