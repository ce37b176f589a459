"""`kvbench kernels`: time the Triton reshape-and-cache and paged decode-attention kernels per KV format."""

from __future__ import annotations

import os
import sys
import time

import typer
from rich.table import Table

from kvbench.cli.clisettings import command_from
from kvbench.cli.commands.kernels_settings import KernelsSettings
from kvbench.core.errors import UsageError
from kvbench.core.output import console, err_console, present, print_json
from kvbench.records import layout, utc_now, write_atomic
from kvbench.specs.formats import speed_kernels

NAME = "kernels"
_SPEED = speed_kernels()  # the tracked dtypes' kernel keys (formats.toml `speed_kernel`): fp16, fp8, nvfp4
HELP = (
    f"Microbenchmark the Triton KV kernels (quantize+write, paged decode attention) for {'/'.join(_SPEED)} over "
    f"context and batch: time, GB/s, % of peak and of measured copy bandwidth, {':'.join(_SPEED)} speed ratio. "
    "Needs a CUDA GPU (SM80+); --interpret runs tiny shapes in Triton's CPU interpreter."
)


def settings_of(ctx: typer.Context, values: dict) -> KernelsSettings:
    return KernelsSettings(**values)


@command_from(KernelsSettings, settings_of)
def command(ctx: typer.Context, s: KernelsSettings) -> None:
    measure(s)


def measure(s: KernelsSettings) -> None:
    """The grid timed on this device and the record written (kernels/run_on_gpu.sh calls this directly)."""
    fmts, ctxs, bats, wtok = s.grid()
    if not _device_ready(s.interpret, s.as_json):
        return
    import torch

    from kvbench.kernels import bench, records

    shape = bench.AttnShape.from_model(s.model, s.block_size)
    dev = bench.device()
    card = bench.catalog_gpu(dev, s.gpu)
    peak = card.hbm_bandwidth_gbs if card else None
    started = utc_now()
    t0 = time.monotonic()
    max_cache_gb = s.max_cache_gb
    if max_cache_gb is None and dev.type == "cuda":
        max_cache_gb = 0.4 * torch.cuda.mem_get_info()[0] / 1e9
    cases = [("decode", f, b, c) for b in bats for c in ctxs for f in fmts] + [
        ("write", f, n, None) for n in wtok for f in fmts
    ]
    doc = {
        **records.header(started, "interpret" if s.interpret else "gpu", shape, card),
        "grid": {"formats": fmts, "contexts": ctxs, "batches": bats, "write_tokens": wtok},
        "skipped": [],
    }
    _run_cases(doc, cases, shape, dev, peak, s.max_seconds, max_cache_gb, t0, s.as_json)
    doc["ratios"] = bench.ratios(doc["decode"], shape)
    doc["targets"] = bench.targets(doc["write"], doc["ratios"]) if dev.type == "cuda" else None
    doc["elapsed_s"] = time.monotonic() - t0
    path = write_atomic(layout.dated_path(s.results_dir, doc["machine"], "kernels", started), doc) if s.record else None
    present(doc, path, s.as_json, _print)


def _device_ready(interpret: bool, as_json: bool) -> bool:
    """Whether there is a device to time on (the interpreter, or a CUDA GPU of SM80+); says why not."""
    if interpret:
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            raise UsageError("--interpret: triton was already imported in this process; set TRITON_INTERPRET=1 instead")
        os.environ["TRITON_INTERPRET"] = "1"  # must precede the first `import triton`
    import torch

    if not interpret and not torch.cuda.is_available():
        why = (
            "no CUDA GPU here, so there is nothing to time (the kernels need SM80+). `kvbench kernels --interpret` "
            "runs them on tiny shapes in Triton's CPU interpreter; "
            "the tests check them against the torch reference the same way."
        )
        if as_json:
            print_json({"status": "no gpu", "reason": why, "record": None})
        else:
            console.print(f"kvbench kernels: {why}")
        return False
    if not interpret and torch.cuda.get_device_capability() < (8, 0):
        raise UsageError(f"{torch.cuda.get_device_name()} is below SM80; the kernels need SM80 or newer")
    return True


def _run_cases(doc: dict, cases: list, shape, dev, peak, max_seconds, max_cache_gb, t0: float, as_json: bool) -> None:
    """The device checks, the copy baseline, then every case in turn (skipped past the time or cache limit)."""
    import torch
    from rich.progress import Progress

    from kvbench.kernels import bench
    from kvbench.kernels.paged_cache import bytes_per_token

    with Progress(console=err_console, transient=True, disable=as_json) as progress:
        task = progress.add_task("device checks", total=len(cases) + 2)
        doc["checks"] = bench.check_on_device(shape, dev, doc["grid"]["formats"])
        progress.advance(task)
        progress.update(task, description="device copy baseline")
        doc["copy_baseline"] = bench.copy_baseline(dev)
        copy_gbs = doc["copy_baseline"]["gbs"] if dev.type == "cuda" else None  # a CPU memcpy is no GPU baseline
        progress.advance(task)
        doc["decode"], doc["write"] = [], []
        for kind, fmt, n, ctx in cases:
            if max_seconds is not None and time.monotonic() - t0 > max_seconds:
                doc["status"] = "partial"
                doc["skipped"].append(
                    {"kind": kind, "format": fmt, "n": n, "context": ctx, "why": "--max-seconds reached"}
                )
                progress.advance(task)
                continue
            tokens = n * ctx if kind == "decode" else n
            need_gb = tokens * bytes_per_token(fmt, shape.num_kv_heads, shape.head_dim) / 1e9
            if max_cache_gb is not None and need_gb > max_cache_gb:
                doc["skipped"].append(
                    {
                        "kind": kind,
                        "format": fmt,
                        "n": n,
                        "context": ctx,
                        "why": f"cache {need_gb:.1f} GB > --max-cache-gb {max_cache_gb:.1f}",
                    }
                )
                progress.advance(task)
                continue
            progress.update(
                task, description=f"{kind} {fmt} " + (f"batch {n} x {ctx:,} tokens" if ctx else f"{n:,} tokens")
            )
            if kind == "decode":
                doc["decode"].append(bench.bench_decode(fmt, n, ctx, shape, dev, peak, copy_gbs))
            else:
                doc["write"].append(bench.bench_write(fmt, n, shape, dev, peak, copy_gbs))
            if dev.type == "cuda":
                torch.cuda.empty_cache()
            progress.advance(task)


def _pct(v) -> str:
    return "—" if v is None else f"{v:.1f}%"


def _print_ratios(ratios: list[dict]) -> None:
    """Decode speed of each tracked dtype's kernel key against the first (auto's fp16), as bench.ratios gives it."""
    base, *others = _SPEED
    t = Table(title=f"Decode-attention speed vs {base} (measured / ideal from bytes)", title_justify="left")
    for col in ("batch", "context", *(f"{f} (µs)" for f in _SPEED), *(f"{base}:{f}" for f in others)):
        t.add_column(col, justify="right")
    for r in ratios:
        tm = r["time_us"]
        times = [f"{tm[f]:,.1f}" if f in tm else "—" for f in _SPEED]
        speed = [f"{r[f'speedup_{f}']:.2f}x / {r[f'ideal_{f}']:.2f}x" if f"speedup_{f}" in r else "—" for f in others]
        t.add_row(str(r["batch"]), f"{r['context']:,}", *times, *speed)
    console.print(t)


def _print(doc: dict) -> None:
    s = doc["shape"]
    where = doc["environment"]["device"]["name"]
    if doc["mode"] == "interpret":
        console.print(
            "[bold yellow]Triton interpreter on the CPU: the times below are a CPU emulation, not GPU times.[/]"
        )
    cat = doc["gpu_catalog"]
    peak = f"{cat['hbm_bandwidth_gbs']:,.0f} GB/s ({cat['key']})" if cat else "—"
    console.print(
        f"{where}; {s['model']} attention: {s['num_heads']} query heads, {s['num_kv_heads']} KV heads, "
        f"head_dim {s['head_dim']}, {s['block_size']}-token pages. Peak (catalog): {peak}; "
        f"measured copy: {doc['copy_baseline']['gbs']:,.1f} GB/s."
    )
    for c in doc["checks"]:
        console.print(
            f"check {c['format']}: write bytes {'==' if c['write_bytes_equal_reference'] else '!='} reference, "
            f"decode max rel err {c['decode_max_rel_err']:.2e} (tolerance {c['decode_tolerance']:.0e}) "
            f"{'ok' if c['ok'] else '[red]FAILED[/]'}"
        )
    t = Table(title="Paged decode attention (1 query token per sequence)", title_justify="left")
    for col in ("format", "batch", "context", "time (µs)", "GB/s", "% of peak", "% of copy"):
        t.add_column(col, justify="left" if col == "format" else "right")
    for r in doc["decode"]:
        t.add_row(
            r["format"],
            str(r["batch"]),
            f"{r['context']:,}",
            f"{r['time_us']:,.1f}",
            f"{r['gbs']:,.1f}",
            _pct(r["pct_of_peak"]),
            _pct(r["pct_of_copy"]),
        )
    console.print(t)
    if doc["ratios"]:
        _print_ratios(doc["ratios"])
    t = Table(title="Reshape-and-cache (quantize + write new K/V tokens)", title_justify="left")
    for col in ("format", "tokens", "time (µs)", "GB/s", "% of peak", "% of copy"):
        t.add_column(col, justify="left" if col == "format" else "right")
    for r in doc["write"]:
        t.add_row(
            r["format"],
            f"{r['tokens']:,}",
            f"{r['time_us']:,.1f}",
            f"{r['gbs']:,.1f}",
            _pct(r["pct_of_peak"]),
            _pct(r["pct_of_copy"]),
        )
    console.print(t)
    if doc.get("targets"):
        w = doc["targets"]["write_pct_of_copy"]
        a = doc["targets"]["nvfp4_decode_speedup_at_32k"]
        console.print(
            f"target: quantize-write >= {w['target']:.0f}% of copy bandwidth: best "
            + ", ".join(f"{f} {v:.1f}%" for f, v in w["best_by_format"].items())
        )
        if a["by_batch"]:
            console.print(
                f"target: nvfp4 decode at 32K >= {a['target']}x fp16 (ideal {a['ideal']:.2f}x): "
                + ", ".join(f"batch {b}: {v:.2f}x" for b, v in a["by_batch"].items())
            )
    for sk in doc["skipped"]:
        console.print(f"skipped {sk['kind']} {sk['format']} n={sk['n']} context={sk['context']}: {sk['why']}")
    if doc["status"] != "complete":
        console.print(f"[yellow]status: {doc['status']}[/]")
