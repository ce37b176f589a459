"""Microbenchmarks of the two kernels: reshape-and-cache (quantize + write new tokens) and paged decode
attention, per KV format, with achieved bandwidth against the GPU catalog's peak and a measured
device-to-device copy. `kvbench kernels` and the asv suite (benchmarks/bench_kernels.py) both call this.

Bytes counted (what the kernel must move at minimum):
- decode attention: the K/V cache of every sequence (block scales included) + q + output;
- reshape-and-cache: the new K/V in the model dtype + the cache bytes written + the slot mapping.
Times are medians of `triton.testing.do_bench` (CUDA events, L2 flushed between runs) on a GPU; in
Triton's interpreter they are wall-clock times of a CPU emulation and say nothing about a GPU.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass

import torch

from kvbench.kernels import paged_cache as pc
from kvbench.kernels.cache_layouts import LAYOUTS
from kvbench.specs.formats import speed_kernels

SCHEMA = "kvbench.kernels/1"
BENCH_FORMATS = speed_kernels()  # the speed ratio fp16 : fp8 : nvfp4 (the tracked dtypes, formats.toml)
# Issue targets the record is checked against (inputs, not results).
TARGET_WRITE_PCT_OF_COPY = 70.0
TARGET_NVFP4_SPEEDUP_AT_32K = 2.5
TARGET_CONTEXT = 32768
TARGET_FP8_SPEEDUP_AT_32K = 1.7


@dataclass(frozen=True)
class AttnShape:
    """One attention layer: query heads, KV heads, head_dim; page size (vLLM's CUDA default 16)."""

    name: str
    num_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int = 16

    @classmethod
    def from_model(cls, key: str, block_size: int = 16) -> AttnShape:
        from kvbench.specs.models import load_model

        m = load_model(key)
        return cls(m.name, m.num_attention_heads, m.num_kv_heads, m.head_dim, block_size)


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() and not interpreting() else "cpu")


def time_ms(fn, dev: torch.device, *, reps: int = 3, warmup_ms: int = 25, rep_ms: int = 100) -> float:
    """Median time of fn() in ms: do_bench on a GPU (warmup_ms, rep_ms of runs), wall clock (reps calls) in
    the interpreter."""
    if dev.type == "cuda":
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
    fn()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def copy_baseline(dev: torch.device, nbytes: int | None = None) -> dict:
    """Device-to-device copy of a large buffer: bytes read + written per second (GB/s = 1e9 B/s)."""
    nbytes = nbytes or (1 << 30 if dev.type == "cuda" else 1 << 24)
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), dev)
    moved = 2 * nbytes
    return {"bytes": moved, "time_us": ms * 1e3, "gbs": moved / (ms * 1e-3) / 1e9}


def catalog_gpu(dev: torch.device, key: str | None = None):
    """The kvbench/data/gpus.toml entry for this device (or the one named), None on the interpreter."""
    from kvbench.specs.gpus import get_gpu, match_nvml_name

    if key:
        return get_gpu(key)
    if dev.type != "cuda":
        return None
    return match_nvml_name(torch.cuda.get_device_name(dev))


# ---------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------


def random_cache(fmt: str, num_blocks: int, shape: AttnShape, dev: torch.device, seed: int = 0) -> pc.PagedKVCache:
    """A cache full of valid random entries, made directly (quantizing 100K+ tokens per case would
    dominate the run; timing does not depend on the values): fp16/bf16 N(0,1); fp8 random codes of
    magnitude 2^-3..2; nvfp4 random nibbles with block scales 0.125..0.23 so values stay O(1)."""
    c = pc.allocate(fmt, num_blocks, shape.num_kv_heads, shape.head_dim, shape.block_size, device=dev)
    LAYOUTS[fmt].fill_random(c, torch.Generator(device=dev).manual_seed(seed))
    return c


def query_dtype(fmt: str) -> torch.dtype:
    """The query and K/V input dtype a format's kernels take: the cache's own 16-bit float, else fp16."""
    element = LAYOUTS[fmt].element
    return element if element.is_floating_point else torch.float16


def calibrate(c: pc.PagedKVCache, k: torch.Tensor, v: torch.Tensor) -> None:
    """Tensor scales from amax, as a calibrated checkpoint has them: the codec's own (kernels/codecs.py); a
    format without a tensor scale keeps 1.0."""
    from kvbench.kernels import codecs

    codec = codecs.get(c.fmt)
    if codec.scaled:
        c.k_scale, c.v_scale = codec.calibrated_scale(k.float()), codec.calibrated_scale(v.float())


def decode_case(fmt: str, batch: int, context: int, shape: AttnShape, dev: torch.device, seed: int = 0):
    """(q, cache, block_table, seq_lens) for `batch` sequences of `context` tokens, pages shuffled."""
    pages = -(-context // shape.block_size)
    c = random_cache(fmt, batch * pages, shape, dev, seed)
    g = torch.Generator(device="cpu").manual_seed(seed)
    block_table = torch.randperm(batch * pages, generator=g).reshape(batch, pages).to(torch.int32).to(dev)
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device=dev)
    q = torch.randn(batch, shape.num_heads, shape.head_dim, device=dev).to(query_dtype(fmt))
    return q, c, block_table, seq_lens


def decode_bytes(fmt: str, batch: int, context: int, shape: AttnShape) -> int:
    kv = batch * context * pc.bytes_per_token(fmt, shape.num_kv_heads, shape.head_dim)
    return kv + 2 * batch * shape.num_heads * shape.head_dim * 2  # + q and output (fp16)


def write_case(fmt: str, tokens: int, shape: AttnShape, dev: torch.device, seed: int = 0):
    """(cache, key, value, slot_mapping) for writing `tokens` new tokens into shuffled slots."""
    pages = -(-tokens // shape.block_size)
    c = pc.allocate(fmt, pages, shape.num_kv_heads, shape.head_dim, shape.block_size, device=dev)
    dt = query_dtype(fmt)
    k = torch.randn(tokens, shape.num_kv_heads, shape.head_dim, device=dev).to(dt)
    v = torch.randn(tokens, shape.num_kv_heads, shape.head_dim, device=dev).to(dt)
    g = torch.Generator(device="cpu").manual_seed(seed)
    slots = torch.randperm(pages * shape.block_size, generator=g)[:tokens].to(dev)
    return c, k, v, slots


def write_bytes(fmt: str, tokens: int, shape: AttnShape) -> int:
    return (
        tokens * 2 * shape.num_kv_heads * shape.head_dim * 2  # K and V in, fp16/bf16
        + tokens * pc.bytes_per_token(fmt, shape.num_kv_heads, shape.head_dim)
        + tokens * 8
    )


# ---------------------------------------------------------------------------------------------
# Measurements
# ---------------------------------------------------------------------------------------------


def _rates(nbytes: int, ms: float, peak_gbs: float | None, copy_gbs: float | None) -> dict:
    gbs = nbytes / (ms * 1e-3) / 1e9
    return {
        "bytes": nbytes,
        "time_us": ms * 1e3,
        "gbs": gbs,
        "pct_of_peak": 100 * gbs / peak_gbs if peak_gbs else None,
        "pct_of_copy": 100 * gbs / copy_gbs if copy_gbs else None,
    }


def bench_decode(
    fmt: str,
    batch: int,
    context: int,
    shape: AttnShape,
    dev: torch.device,
    peak_gbs: float | None = None,
    copy_gbs: float | None = None,
) -> dict:
    from kvbench.kernels.decode_attention import decode_attention

    q, c, bt, sl = decode_case(fmt, batch, context, shape, dev)
    ws: dict = {}
    fn = lambda: decode_attention(q, c, bt, sl, max_seq_len=context, workspace=ws)  # noqa: E731
    ms = time_ms(fn, dev)
    out = {
        "format": fmt,
        "batch": batch,
        "context": context,
        **_rates(decode_bytes(fmt, batch, context, shape), ms, peak_gbs, copy_gbs),
    }
    return out


def bench_write(
    fmt: str,
    tokens: int,
    shape: AttnShape,
    dev: torch.device,
    peak_gbs: float | None = None,
    copy_gbs: float | None = None,
) -> dict:
    c, k, v, slots = write_case(fmt, tokens, shape, dev)
    ms = time_ms(lambda: pc.reshape_and_cache(c, k, v, slots), dev)
    out = {"format": fmt, "tokens": tokens, **_rates(write_bytes(fmt, tokens, shape), ms, peak_gbs, copy_gbs)}
    return out


def check_on_device(shape: AttnShape, dev: torch.device, formats=BENCH_FORMATS) -> list[dict]:
    """Before timing: on this device, the Triton write gives the reference bytes and decode attention
    matches the reference (small case, Llama shape)."""
    from kvbench.kernels.decode_attention import TOLERANCE, decode_attention, decode_attention_reference

    rows = []
    for fmt in formats:
        n = 4 * shape.block_size + 3
        c, k, v, slots = write_case(fmt, n, shape, dev, seed=7)
        calibrate(c, k, v)
        pc.reshape_and_cache(c, k, v, slots)
        ref = pc.allocate(
            fmt,
            c.num_blocks,
            shape.num_kv_heads,
            shape.head_dim,
            shape.block_size,
            k_scale=c.k_scale,
            v_scale=c.v_scale,
        )
        pc.write_reference(ref, k.cpu(), v.cpu(), slots.cpu())
        same = torch.equal(c.cache.cpu().view(torch.uint8), ref.cache.view(torch.uint8))
        pages = slots.cpu() // shape.block_size
        # a block table listing each page once, in slot order, covering the n tokens
        order = torch.argsort(slots.cpu())
        bt = pages[order].unique_consecutive()[None].to(torch.int32)
        # attend over the pages as written (token order = slot order)
        seq = torch.tensor([min(n, bt.shape[1] * shape.block_size)], dtype=torch.int32)
        qdt = query_dtype(fmt)
        q = torch.randn(1, shape.num_heads, shape.head_dim, generator=torch.Generator().manual_seed(8)).to(qdt)
        out = decode_attention(q.to(dev), c, bt.to(dev), seq.to(dev), out_dtype=torch.float32)
        expect = decode_attention_reference(q, ref, bt, seq)
        err = float((out.cpu() - expect).abs().max() / expect.abs().max())
        tol = TOLERANCE[str(qdt).removeprefix("torch.")]
        rows.append(
            {
                "format": fmt,
                "write_bytes_equal_reference": same,
                "decode_max_rel_err": err,
                "decode_tolerance": tol,
                "ok": same and err < tol,
            }
        )
    return rows


def ratios(decode_rows: list[dict], shape: AttnShape) -> list[dict]:
    """Per (batch, context): decode time fp16 : fp8 : nvfp4 as speedups over fp16, with the ideal
    (bytes) speedups beside them."""
    out, (base, *others) = [], BENCH_FORMATS  # base: auto's kernel key (fp16), the others against it
    keys = sorted({(r["batch"], r["context"]) for r in decode_rows})
    for b, ctx in keys:
        t = {r["format"]: r["time_us"] for r in decode_rows if (r["batch"], r["context"]) == (b, ctx)}
        if base not in t:
            continue
        row = {"batch": b, "context": ctx, "time_us": t}
        for f in others:
            if f in t:
                row[f"speedup_{f}"] = t[base] / t[f]
                row[f"ideal_{f}"] = decode_bytes(base, b, ctx, shape) / decode_bytes(f, b, ctx, shape)
        out.append(row)
    return out


def targets(write_rows: list[dict], ratio_rows: list[dict]) -> dict:
    """The issue's targets, checked against what was measured (None where not measured)."""
    best_write = {}
    for r in write_rows:
        if r["pct_of_copy"] is not None:
            best_write[r["format"]] = max(best_write.get(r["format"], 0.0), r["pct_of_copy"])
    at = [r for r in ratio_rows if r["context"] == TARGET_CONTEXT and "speedup_nvfp4" in r]
    at8 = [r for r in ratio_rows if r["context"] == TARGET_CONTEXT and "speedup_fp8" in r]
    return {
        "write_pct_of_copy": {
            "target": TARGET_WRITE_PCT_OF_COPY,
            "best_by_format": best_write,
            "met": {f: v >= TARGET_WRITE_PCT_OF_COPY for f, v in best_write.items()} or None,
        },
        "nvfp4_decode_speedup_at_32k": {
            "target": TARGET_NVFP4_SPEEDUP_AT_32K,
            "by_batch": {r["batch"]: r["speedup_nvfp4"] for r in at},
            "ideal": at[0]["ideal_nvfp4"] if at else None,
            "met": {r["batch"]: r["speedup_nvfp4"] >= TARGET_NVFP4_SPEEDUP_AT_32K for r in at} or None,
        },
        "fp8_decode_speedup_at_32k": {
            "target": TARGET_FP8_SPEEDUP_AT_32K,
            "by_batch": {r["batch"]: r["speedup_fp8"] for r in at8},
            "ideal": at8[0]["ideal_fp8"] if at8 else None,
            "met": {r["batch"]: r["speedup_fp8"] >= TARGET_FP8_SPEEDUP_AT_32K for r in at8} or None,
        },
    }
