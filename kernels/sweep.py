"""One prepared GPU sweep (`MODE=sweep kernels/run_on_gpu.sh`): in one call, check every kernel variant and
candidate configuration against its torch reference on the device, time the grid for each, keep the fastest
correct one per format and shape, and write one record (schema kvbench.kernels/1) holding all of them, the
cost-isolating variants, a 10 Hz NVML trace with the phases marked, and the device-memory view.

Candidates are labelled candidates: which one is fastest is what the device says, nothing here assumes it.
- decode: TILE_N x num_warps x num_stages, and for nvfp4 the dequantization path (DEQUANT: "f32" as committed,
  "f16" the bit-pattern candidate), on tensor cores; plus the "fma" matmuls (MMA: no padding of 4 query heads
  to 16 rows); "as is" is the committed kernel's launch (TILE_N 64, Triton's defaults of 4 warps and 3
  stages, f32, tensor cores);
- variants, at the as-is launch: load_only (the bytes, nothing decoded: an upper bound) and dequant_only (the
  dequantization without the dot); for nvfp4 dequant_only also with the f16 path;
- write: num_warps, and for nvfp4 the E2M1 encoder (ENCODERS: "compare" as committed, "bits" the candidate).
"""

from __future__ import annotations

import itertools
import time

import torch

from kvbench.kernels import bench, records, variants
from kvbench.kernels import decode_attention as da
from kvbench.kernels import paged_cache as pc
from kvbench.kernels.cache_layouts import LAYOUTS
from kvbench.kernels.gpu_evidence import Trace, device_memory
from kvbench.records import layout, utc_now, write_atomic

# 32K first: the targets are there, and a sweep cut short by its clock should still have them
GPU_GRID = {
    "formats": list(bench.BENCH_FORMATS),  # the tracked dtypes' kernel keys (formats.toml)
    "contexts": [32768, 131072, 4096, 16384, 1024],
    "batches": [32, 8, 1],
    "write_tokens": [16384, 131072, 4096, 1024, 32, 8, 1],
}
DRY_GRID = {"formats": list(bench.BENCH_FORMATS), "contexts": [40], "batches": [2], "write_tokens": [5]}
DRY_SHAPE = bench.AttnShape("dry run: 8 query heads, 2 KV heads, head_dim 64", 8, 2, 64, 16)
AS_IS = {"tile_n": 64, "num_warps": 4, "num_stages": 3, "dequant": "f32", "mma": "dot"}
SCREEN = {"warmup_ms": 10, "rep_ms": 40}  # do_bench per candidate: shorter than `kvbench kernels`' 25 / 100 ms


def decode_candidates(fmt: str, dry: bool) -> list[dict]:
    """The tensor-core ("dot") grid, plus the "fma" matmuls at the one launch that compiles for sm_90 without
    spilling nvfp4's registers (TILE_N 64, 8 warps: 4 local stores vs 141-186 at the others)."""
    tiles, warps, stages = ((16,), (4,), (3,)) if dry else ((64, 128), (4, 8), (2, 3))
    deqs = LAYOUTS[fmt].dequant_paths
    dot = [
        {"tile_n": t, "num_warps": w, "num_stages": s, "dequant": d, "mma": "dot"}
        for t, w, s, d in itertools.product(tiles, warps, stages, deqs)
    ]
    fma = {"tile_n": 16 if dry else 64, "num_warps": 4 if dry else 8, "num_stages": 3, "mma": "fma"}
    return dot + [{**fma, "dequant": d} for d in deqs]


def as_is(dry: bool) -> dict:
    return {**AS_IS, "tile_n": 16} if dry else dict(AS_IS)


def variant_runs(fmt: str, dry: bool) -> list[tuple[str, dict]]:
    base = as_is(dry)
    runs = [("load_only", base), ("dequant_only", base)]
    # the other dequantization paths of the format's decode kernel (nvfp4's f16), dequant_only each
    return runs + [("dequant_only", {**base, "dequant": d}) for d in LAYOUTS[fmt].dequant_paths if d != base["dequant"]]


def write_candidates(fmt: str, dry: bool) -> list[dict]:
    encs = LAYOUTS[fmt].encoders
    return [{"encode": e, "num_warps": w} for e in encs for w in ((4,) if dry else (1, 2, 4))]


def label(cfg: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in cfg.items())


# ---------------------------------------------------------------------------------------------
# Checks on the device
# ---------------------------------------------------------------------------------------------


def _error(exc: Exception) -> str:
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:300]


def check_decode(fmt: str, shape: bench.AttnShape, dev: torch.device, runs: list[tuple[str, dict]], dry: bool) -> list:
    """Every (variant, config) on a small case with several partitions, against its torch reference."""
    batch, context = (2, 40) if dry else (2, 700)
    q, c, bt, sl = bench.decode_case(fmt, batch, context, shape, dev, seed=11)
    if fmt != bench.BENCH_FORMATS[0]:  # all but the 16-bit baseline (fp16)
        c.k_scale, c.v_scale = 0.5, 0.25  # tensor scales other than 1, so the folds are exercised
    host = pc.PagedKVCache(c.cache.cpu(), fmt, c.num_kv_heads, c.head_dim, c.block_size, c.k_scale, c.v_scale)
    refs = {"full": da.decode_attention_reference(q.cpu(), host, bt.cpu(), sl.cpu())}
    rows = []
    for variant, cfg in runs:
        tol = da.TOLERANCE["float16"] if variant == "full" else variants.TOLERANCE[variant]
        row = {"format": fmt, "variant": variant, "config": cfg, "tolerance": tol, "max_rel_err": None}
        try:
            if variant not in refs:
                refs[variant] = variants.variant_reference(variant, host, bt.cpu(), sl.cpu(), shape.num_heads)
            out = da.decode_attention(
                q, c, bt, sl, out_dtype=torch.float32, partition=2 * cfg["tile_n"], variant=variant, **cfg
            )
            row["max_rel_err"] = variants.max_rel_err(out, refs[variant])
            row["ok"] = row["max_rel_err"] < tol
        except Exception as exc:  # a launch the device refuses (e.g. shared memory) is a failed candidate
            row.update(ok=False, error=_error(exc))
        rows.append(row)
    return rows


def check_write(fmt: str, shape: bench.AttnShape, dev: torch.device, cands: list[dict]) -> list[dict]:
    """Every write candidate gives the reference bytes (tensor scales from amax, as a calibrated model has)."""
    n = 4 * shape.block_size + 3
    c, k, v, slots = bench.write_case(fmt, n, shape, dev, seed=7)
    bench.calibrate(c, k, v)
    ref = pc.allocate(
        fmt, c.num_blocks, shape.num_kv_heads, shape.head_dim, shape.block_size, k_scale=c.k_scale, v_scale=c.v_scale
    )
    pc.write_reference(ref, k.cpu(), v.cpu(), slots.cpu())
    rows = []
    for cfg in cands:
        row = {"format": fmt, "variant": "write", "config": cfg}
        try:
            c.cache.zero_()
            pc.reshape_and_cache(c, k, v, slots, **cfg)
            row["ok"] = torch.equal(c.cache.cpu().view(torch.uint8), ref.cache.view(torch.uint8))
        except Exception as exc:
            row.update(ok=False, error=_error(exc))
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------


class Sweep:
    """The grid's state: the record being built, the clock, the trace."""

    def __init__(self, doc: dict, shape, dev, trace: Trace, peak, copy_gbs, deadline: float, dry: bool):
        self.doc, self.shape, self.dev, self.trace = doc, shape, dev, trace
        self.peak, self.copy_gbs, self.deadline, self.dry = peak, copy_gbs, deadline, dry
        self.max_cache_gb = 0.4 * torch.cuda.mem_get_info(dev)[0] / 1e9 if dev.type == "cuda" else None

    def _time(self, fn, nbytes: int, name: str) -> dict:
        t = time.perf_counter()
        ms = bench.time_ms(fn, self.dev, reps=1 if self.dry else 3, **SCREEN)
        rates = bench._rates(nbytes, ms, self.peak, self.copy_gbs)
        self.trace.mark(name, t, kind="case", gbs=rates["gbs"])
        return rates

    def _skip(self, kind: str, fmt: str, n: int, ctx, need_gb: float) -> bool:
        why = None
        if time.monotonic() > self.deadline:
            why = "sweep clock reached"
            self.doc["status"] = "partial"
        elif self.max_cache_gb is not None and need_gb > self.max_cache_gb:
            why = f"cache {need_gb:.1f} GB > 40% of free GPU memory ({self.max_cache_gb:.1f} GB)"
        if why:
            self.doc["skipped"].append({"kind": kind, "format": fmt, "n": n, "context": ctx, "why": why})
        return why is not None

    def decode_shape(self, fmt: str, batch: int, ctx: int, ok_cfgs: list[dict], ok_variants: list) -> None:
        need = batch * ctx * pc.bytes_per_token(fmt, self.shape.num_kv_heads, self.shape.head_dim) / 1e9
        if not ok_cfgs or self._skip("decode", fmt, batch, ctx, need):
            return
        q, c, bt, sl = bench.decode_case(fmt, batch, ctx, self.shape, self.dev)
        nbytes = bench.decode_bytes(fmt, batch, ctx, self.shape)
        base = {"format": fmt, "batch": batch, "context": ctx}
        rows = []
        for variant, cfg in [("full", x) for x in ok_cfgs] + ok_variants:
            ws: dict = {}

            # the variants' column sums would overflow an fp16 output to inf: they write fp32 (B x Hq x D x 4
            # bytes, nothing next to the cache they read)
            out_dtype = None if variant == "full" else torch.float32

            def fn(variant=variant, cfg=cfg, ws=ws, out_dtype=out_dtype):
                return da.decode_attention(
                    q, c, bt, sl, max_seq_len=ctx, workspace=ws, variant=variant, out_dtype=out_dtype, **cfg
                )

            name = f"decode {fmt} batch {batch} x {ctx} {variant} ({label(cfg)})"
            rows.append({**base, "variant": variant, "config": cfg, **self._time(fn, nbytes, name)})
        full = [r for r in rows if r["variant"] == "full"]
        self.doc["sweep"]["decode_all"] += full
        self.doc["sweep"]["decode_variants"] += [r for r in rows if r["variant"] != "full"]
        self.doc["sweep"]["decode_variants"] += [r for r in full if r["config"] == as_is(self.dry)]
        self.doc["decode"].append(min(full, key=lambda r: r["time_us"]))

    def write_size(self, fmt: str, tokens: int, ok_cfgs: list[dict]) -> None:
        need = tokens * pc.bytes_per_token(fmt, self.shape.num_kv_heads, self.shape.head_dim) / 1e9
        if not ok_cfgs or self._skip("write", fmt, tokens, None, need):
            return
        c, k, v, slots = bench.write_case(fmt, tokens, self.shape, self.dev)
        nbytes = bench.write_bytes(fmt, tokens, self.shape)
        rows = []
        for cfg in ok_cfgs:
            rates = self._time(
                lambda cfg=cfg: pc.reshape_and_cache(c, k, v, slots, **cfg),
                nbytes,
                f"write {fmt} {tokens} ({label(cfg)})",
            )
            rows.append({"format": fmt, "tokens": tokens, "variant": "write", "config": cfg, **rates})
        self.doc["sweep"]["write_all"] += rows
        self.doc["write"].append(min(rows, key=lambda r: r["time_us"]))


def bounds(variant_rows: list[dict]) -> list[dict]:
    """Per (format, batch, context): where the as-is kernel's time goes, from its variants on the same case:
    loading the bytes (load_only / as is), dequantizing (dequant_only - load_only), the dots and softmax (as
    is - dequant_only). Shares of the as-is time; derived, not measured separately."""
    out = []
    keys = sorted({(r["format"], r["batch"], r["context"]) for r in variant_rows})
    for fmt, b, ctx in keys:
        rs = [r for r in variant_rows if (r["format"], r["batch"], r["context"]) == (fmt, b, ctx)]
        t = {(r["variant"], r["config"]["dequant"]): r for r in rs}
        full, load, deq = t.get(("full", "f32")), t.get(("load_only", "f32")), t.get(("dequant_only", "f32"))
        if not (full and load and deq):
            continue
        tf = full["time_us"]
        out.append(
            {
                "format": fmt,
                "batch": b,
                "context": ctx,
                "time_us": {"as_is": tf, "load_only": load["time_us"], "dequant_only": deq["time_us"]},
                "gbs": {"as_is": full["gbs"], "load_only": load["gbs"], "dequant_only": deq["gbs"]},
                "pct_of_copy": {"as_is": full["pct_of_copy"], "load_only": load["pct_of_copy"]},
                "share": {
                    "load": load["time_us"] / tf,
                    "dequant": (deq["time_us"] - load["time_us"]) / tf,
                    "dot_softmax": (tf - deq["time_us"]) / tf,
                },
                "dequant_only_f16_us": (t.get(("dequant_only", "f16")) or {}).get("time_us"),
            }
        )
    return out


# ---------------------------------------------------------------------------------------------
# The one call
# ---------------------------------------------------------------------------------------------


def _header(shape, dev, card, dry: bool, started) -> dict:
    grid = DRY_GRID if dry else GPU_GRID
    return {
        **records.header(started, "interpret" if dev.type != "cuda" else "gpu", shape, card),
        "kernel": "kvbench's reference Triton kernels (kernels/), not vLLM's",
        "grid": {k: sorted(v) if k != "formats" else list(v) for k, v in grid.items()},
        "skipped": [],
        "decode": [],
        "write": [],
        "sweep": {
            "candidates": {f: decode_candidates(f, dry) for f in grid["formats"]},
            "write_candidates": {f: write_candidates(f, dry) for f in grid["formats"]},
            "as_is": as_is(dry),
            "checks": [],
            "decode_all": [],
            "decode_variants": [],
            "write_all": [],
        },
    }


def _checks(sw: Sweep, fmts: list[str]) -> tuple[dict, dict, dict]:
    """Every candidate and variant checked on the device; only those that pass are timed."""
    ok_dec, ok_var, ok_wr = {}, {}, {}
    for fmt in fmts:
        t = time.perf_counter()
        runs = [("full", cfg) for cfg in decode_candidates(fmt, sw.dry)] + variant_runs(fmt, sw.dry)
        rows = check_decode(fmt, sw.shape, sw.dev, runs, sw.dry)
        rows += check_write(fmt, sw.shape, sw.dev, write_candidates(fmt, sw.dry))
        sw.doc["sweep"]["checks"] += rows
        ok_dec[fmt] = [r["config"] for r in rows if r["variant"] == "full" and r["ok"]]
        ok_var[fmt] = [(r["variant"], r["config"]) for r in rows if r["variant"] not in ("full", "write") and r["ok"]]
        ok_wr[fmt] = [r["config"] for r in rows if r["variant"] == "write" and r["ok"]]
        sw.trace.mark(f"check {fmt}", t, kind="phase")
    return ok_dec, ok_var, ok_wr


def _grid(doc: dict, sw: Sweep) -> None:
    """Copy baseline, checks, then the write and decode grids, each phase marked on the trace."""
    dev, dry, grid, trace = sw.dev, sw.dry, doc["grid"], sw.trace
    t = time.perf_counter()
    doc["copy_baseline"] = bench.copy_baseline(dev)
    trace.mark("copy baseline", t, kind="phase", gbs=doc["copy_baseline"]["gbs"])
    sw.copy_gbs = doc["copy_baseline"]["gbs"] if not dry else None  # a CPU memcpy is no GPU baseline
    t = time.perf_counter()
    doc["checks"] = bench.check_on_device(sw.shape, dev, grid["formats"])
    trace.mark("check as-is write + attention", t, kind="phase")
    ok_dec, ok_var, ok_wr = _checks(sw, grid["formats"])
    # writes first: few and quick, so a sweep cut short by its clock still has every write target
    t = time.perf_counter()
    order = DRY_GRID if dry else GPU_GRID  # the record's grid is sorted; this is the order of priority
    for tokens, fmt in itertools.product(order["write_tokens"], grid["formats"]):
        sw.write_size(fmt, tokens, ok_wr[fmt])
    trace.mark("write grid", t, kind="phase")
    t = time.perf_counter()
    for ctx, batch, fmt in itertools.product(order["contexts"], order["batches"], grid["formats"]):
        sw.decode_shape(fmt, batch, ctx, ok_dec[fmt], ok_var[fmt])
        if not dry:
            torch.cuda.empty_cache()  # the case's cache is gone once decode_shape returns
    trace.mark("decode grid", t, kind="phase")


def run(results_dir, *, max_seconds: float = 380.0) -> dict:
    """The whole sweep on this device (the Triton interpreter when TRITON_INTERPRET=1: the dry run's grid and
    shape); returns the record, written under results_dir/<machine>/kernels/."""
    t0 = time.monotonic()
    dev = bench.device()
    dry = dev.type != "cuda"
    shape = DRY_SHAPE if dry else bench.AttnShape.from_model("llama-3.1-8b")
    card = bench.catalog_gpu(dev)
    started = utc_now()
    doc = _header(shape, dev, card, dry, started)
    doc["device_memory"] = device_memory(dev, card)
    doc["checks"], doc["copy_baseline"] = [], None
    with Trace(dev) as trace:
        try:
            _grid(
                doc,
                Sweep(doc, shape, dev, trace, card.hbm_bandwidth_gbs if card else None, None, t0 + max_seconds, dry),
            )
        except KeyboardInterrupt:  # run_on_gpu.sh's hard timeout sends SIGINT: keep what was measured
            doc["status"] = "interrupted"
    if doc["device_memory"].get("available"):
        doc["device_memory"]["torch_max_allocated_bytes"] = torch.cuda.max_memory_allocated(dev)
    doc["telemetry"] = trace.as_dict()
    doc["ratios"] = bench.ratios(doc["decode"], shape)
    doc["targets"] = bench.targets(doc["write"], doc["ratios"]) if not dry else None
    doc["sweep"]["bounds"] = bounds(doc["sweep"]["decode_variants"])
    doc["sweep"]["all_checks_ok"] = all(r["ok"] for r in doc["sweep"]["checks"] + doc["checks"])
    doc["elapsed_s"] = time.monotonic() - t0
    path = write_atomic(layout.dated_path(results_dir, doc["machine"], "kernels", started), doc)
    summary(doc, path)
    return doc


def summary(doc: dict, path) -> None:
    """The log's lines: checks, the chosen configuration per shape, the bounds, the targets, the device view."""
    checks = doc["sweep"]["checks"]
    bad = [c for c in checks if not c["ok"]]
    if doc["mode"] == "interpret":
        print("Triton interpreter on the CPU: the times and shares below are a CPU emulation, not GPU times")
    print(
        f"sweep ({doc['mode']}): {len(checks) - len(bad)}/{len(checks)} variant and candidate checks "
        "passed on the device"
    )
    for c in bad:
        print(f"  FAILED {c['format']} {c['variant']} ({label(c['config'])}): {c.get('error') or c.get('max_rel_err')}")
    for r in doc["decode"]:
        print(
            f"decode {r['format']:>5} batch {r['batch']:>3} x {r['context']:>7}: {r['time_us']:10.1f} µs "
            f"{r['gbs']:8.1f} GB/s  fastest correct: {label(r['config'])}"
        )
    for b in doc["sweep"]["bounds"]:
        s = b["share"]
        print(
            f"bound {b['format']:>5} batch {b['batch']:>3} x {b['context']:>7}: "
            f"load only {b['gbs']['load_only']:.0f} GB/s, "
            f"as is {b['gbs']['as_is']:.0f} GB/s; time shares load {s['load']:.0%}, dequant {s['dequant']:.0%}, "
            f"dot+softmax {s['dot_softmax']:.0%}"
        )
    for r in doc["write"]:
        print(
            f"write {r['format']:>5} {r['tokens']:>7} tokens: {r['gbs']:8.1f} GB/s  "
            f"fastest correct: {label(r['config'])}"
        )
    for name, t in (doc.get("targets") or {}).items():
        print(f"target {name}: {t}")
    mem = doc["device_memory"]
    print("device memory:", mem if not mem.get("available") else {k: mem[k] for k in ("torch", "differences_mib")})
    tel = doc["telemetry"]
    print(f"NVML trace: {len(tel['samples'])} samples" if tel["available"] else f"NVML trace: {tel['reason']}")
    for sk in doc["skipped"]:
        print(f"skipped {sk['kind']} {sk['format']} n={sk['n']} context={sk['context']}: {sk['why']}")
    print(f"status: {doc['status']}; record: {path}")
