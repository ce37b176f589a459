"""Kernels and accuracy: achieved GB/s of the Triton kernels against the GPU's roofline, and attention error
per KV format on each data source (`kvbench kernels`, `kvbench accuracy` records)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvbench.dashboards.components import Page, date_text, empty, fmt, note, section, slug, table
from kvbench.dashboards.data import SiteData
from kvbench.dashboards.theme import color, esc, log_ticks, ordered, style, symbol

SLUG, TITLE = "kernels", "Kernels and accuracy"
MAX_BATCH_PANELS = 4
SCALE_PATTERNS = {"1": "/", "amax": "", "-": ""}  # hatched: vLLM's default tensor scale 1.0; solid: calibrated (amax)
SCALE_WORDS = {"1": "scale 1 (vLLM default)", "amax": "scale amax (calibrated)", "-": "no tensor scale"}


def _custom(r, machine, run_id, vllm, extra):
    return [esc(run_id), esc(date_text(r["created_at"])), esc(vllm), esc(machine), *[esc(e) for e in extra]]


STD_HOVER = (
    "<br>run %{customdata[0]}<br>%{customdata[1]}<br>vLLM %{customdata[2]}<br>machine %{customdata[3]}<extra></extra>"
)


def _gbs_trace(pts: pd.DataFrame, x: str, f: str, show: bool, hover: str, ident: tuple, which) -> go.Scatter:
    """Format f's achieved GB/s along column `x`. hover: the kernel's words before the token count
    ('decode: ... GB/s at'); ident: (machine, run id, vLLM version) for _custom; which(row): the words naming
    the variant and configuration that produced the point."""
    return go.Scatter(
        x=pts[x],
        y=pts["gbs"],
        mode="lines+markers",
        name=esc(f),
        legendgroup=f,
        showlegend=show,
        line={"color": color(f)},
        marker={"color": color(f), "symbol": symbol(f), "size": 9},
        customdata=[
            _custom(r, *ident, [f, fmt(r["time_us"], 1), fmt(r["pct_of_peak"], 1, "%"), which(r)])
            for _, r in pts.iterrows()
        ],
        hovertemplate=(
            f"<b>%{{customdata[4]}}</b> {hover} %{{x:,}} tokens<br>%{{customdata[5]}} µs, %{{customdata[6]}} of peak"
            "<br>%{customdata[7]}"
        )
        + STD_HOVER,
    )


def _log_x(fig: go.Figure, col: int, title: str, values: pd.Series) -> None:
    """Subplot `col`'s x axis: log scale with whole-number ticks spanning `values` (none when it is empty)."""
    ticks = log_ticks(values.min(), values.max()) if not values.empty else None
    fig.update_xaxes(type="log", title_text=title, row=1, col=col, tickformat=",d", tickvals=ticks)


AS_COMMITTED = "kvbench reference kernel as committed (one configuration)"


def _labels(doc: dict) -> dict:
    """(kernel, format, batch or tokens, context) -> the words naming what produced that line's point."""
    out = {}
    for kind, n in (("decode", "batch"), ("write", "tokens")):
        for r in doc.get(kind) or []:
            cfg = r.get("config")
            words = (
                "sweep's fastest correct candidate: " + ", ".join(f"{k} {v}" for k, v in cfg.items()) if cfg else None
            )
            out[(kind, r.get("format"), r.get(n), r.get("context"))] = words or AS_COMMITTED
    return out


def _which(labels: dict, kind: str):
    def which(r) -> str:
        n = r["batch"] if kind == "decode" else r["tokens"]
        ctx = r["context"] if kind == "decode" else None
        return esc(labels.get((kind, r["format"], int(n), None if ctx is None else int(ctx)), AS_COMMITTED))

    return which


def kernel_figure(doc: dict, rows: pd.DataFrame) -> go.Figure:
    machine, run_id = doc.get("machine"), Path(doc["_path"]).stem
    labels = _labels(doc)
    ident = (machine, run_id, (doc.get("environment") or {}).get("vllm"))  # every point's hover names its run
    dec = rows[rows["kernel"] == "decode"]
    batches = sorted(dec["batch"].dropna().unique())
    if len(batches) > MAX_BATCH_PANELS:  # keep the smallest, largest and evenly spaced ones between
        batches = [batches[int(i)] for i in np.linspace(0, len(batches) - 1, MAX_BATCH_PANELS)]
    titles = [f"decode attention, batch {int(b)}" for b in batches] + ["quantize + write (reshape-and-cache)"]
    fig = make_subplots(rows=1, cols=len(titles), subplot_titles=titles, shared_yaxes=True, horizontal_spacing=0.04)
    shown = set()
    for col, batch in enumerate(batches, start=1):
        for f in ordered(dec["format"]):
            pts = dec[(dec["format"] == f) & (dec["batch"] == batch)].sort_values("context")
            if pts.empty:
                continue
            fig.add_trace(
                _gbs_trace(
                    pts, "context", f, f not in shown, "decode: %{y:,.1f} GB/s at", ident, _which(labels, "decode")
                ),
                row=1,
                col=col,
            )
            shown.add(f)
        _log_x(fig, col, "context (tokens)", dec["context"])
    wr = rows[rows["kernel"] == "write"]
    wcol = len(titles)
    for f in ordered(wr["format"]):
        pts = wr[wr["format"] == f].sort_values("tokens")
        trace = _gbs_trace(
            pts, "tokens", f, f not in shown, "write: %{y:,.1f} GB/s for", ident, _which(labels, "write")
        )
        fig.add_trace(trace, row=1, col=wcol)
        shown.add(f)
    _log_x(fig, wcol, "new tokens written (tokens)", wr["tokens"])
    peak = rows["peak_gbs"].dropna()
    copy = rows["copy_gbs"].dropna()
    # (values, label, colour, dash, extra annotation keys); the label goes on the first subplot only
    bounds = [(peak, "roofline", "#D55E00", "dash", {}), (copy, "measured copy", "#555", "dot", {"yanchor": "top"})]
    for col in range(1, len(titles) + 1):
        for values, label, colour, dash, extra in bounds:
            if len(values):
                gbs = float(values.iloc[0])
                annotation = {"text": f"{label} {gbs:,.0f} GB/s" if col == 1 else "", "font": {"color": colour}}
                line = {"color": colour, "dash": dash}
                fig.add_hline(y=gbs, line=line, row=1, col=col, annotation={**annotation, **extra})
    fig.update_yaxes(title_text="achieved bandwidth (GB/s, 10^9 B/s)", rangemode="tozero", row=1, col=1)
    style(fig, f"{machine}: kernel bandwidth vs the GPU's roofline", height=460)
    return fig


def _missed(doc: dict) -> list[str]:
    """The targets the record judged and missed, in words."""
    out = []
    for name, t in (doc.get("targets") or {}).items():
        met = (t or {}).get("met") or {}
        out += [f"{name.replace('_', ' ')} ({k})" for k, ok in met.items() if ok is False]
    return out


def provenance_note(doc: dict) -> str:
    """Which kernel and variant drew the lines, and, while a target is missed, that they are kvbench's own."""
    if (doc.get("sweep") or {}).get("candidates"):
        which = (
            "each point is the fastest candidate configuration of kvbench's reference Triton kernels that passed "
            "its torch-reference check on the device (the hover names it; the record's <code>sweep</code> holds "
            "every candidate and variant)"
        )
    else:
        which = "each line is kvbench's reference Triton kernel as committed (one configuration, no sweep)"
    out = note(f"What drew these lines: {which}.")
    missed = _missed(doc)
    if missed:
        out += note(
            "Targets missed: "
            + esc("; ".join(missed))
            + ". These figures are <b>kvbench's reference kernels (kernels/), not vLLM's</b>: they say what this "
            "kernel does on this GPU, not what the format allows or what vLLM's kernels reach.",
            "warn",
        )
    return out


def fp8_words(doc: dict) -> str:
    """fp8's decode speed-up at 32K: against its target when the record judged it, else as measured."""
    t = (doc.get("targets") or {}).get("fp8_decode_speedup_at_32k")
    if t:
        by = ", ".join(f"batch {b}: {v:.2f}x" for b, v in (t.get("by_batch") or {}).items()) or "not measured"
        return f"; fp8 decode at 32K ≥ {fmt(t.get('target'), 1)}x fp16 (ideal {fmt(t.get('ideal'), 2)}x) — {esc(by)}"
    at = [r for r in doc.get("ratios") or [] if r.get("context") == 32768 and "speedup_fp8" in r]
    if not at:
        return ""
    return "; fp8 decode at 32K (not judged by this record) — " + esc(
        ", ".join(f"batch {r['batch']}: {r['speedup_fp8']:.2f}x (ideal {r['ideal_fp8']:.2f}x)" for r in at)
    )


def bounds_table(doc: dict) -> str:
    """Where the as-is decode kernel's time goes, from its cost-isolating variants on the same case."""
    rows = (doc.get("sweep") or {}).get("bounds") or []
    if not rows:
        return ""
    view = pd.DataFrame(
        {
            "format": [r["format"] for r in rows],
            "batch": [r["batch"] for r in rows],
            "context": [f"{r['context']:,}" for r in rows],
            "load": [
                f"{fmt(r['gbs']['load_only'], 0)} GB/s ({fmt(r['pct_of_copy']['load_only'], 0, '%')})" for r in rows
            ],
            "deq": [f"{fmt(r['gbs']['dequant_only'], 0)} GB/s" for r in rows],
            "asis": [f"{fmt(r['gbs']['as_is'], 0)} GB/s ({fmt(r['pct_of_copy']['as_is'], 0, '%')})" for r in rows],
            "share": [
                f"{r['share']['load']:.0%} / {r['share']['dequant']:.0%} / {r['share']['dot_softmax']:.0%}"
                for r in rows
            ],
        }
    )
    cols = {
        "format": "format",
        "batch": "batch",
        "context": "context (tokens)",
        "load": "load only (% of copy)",
        "deq": "dequantize, no dot",
        "asis": "as is (% of copy)",
        "share": "time: load / dequantize / dot+softmax",
    }
    return (
        "<p>Cost-isolating variants of the as-is decode kernel on the same cases: loading the bytes only (an upper "
        "bound), dequantizing without the dot, and the kernel as is; shares are of the as-is time.</p>"
        + table(view, cols, numeric={"batch"})
    )


TRACE_ROWS = (  # (fields, axis title) of the NVML trace's panels below the achieved rate
    (("sm_util_pct", "mem_util_pct"), "utilisation (%)"),
    (("power_w",), "power (W)"),
    (("sm_clock_mhz", "mem_clock_mhz"), "clock (MHz)"),
    (("memory_used_bytes",), "memory used (GiB)"),
    (("temperature_c",), "temperature (°C)"),
)


def telemetry_figure(doc: dict) -> go.Figure | None:
    """The sweep's 10 Hz NVML trace on one time axis, with each timed case's achieved GB/s above it and the
    phases shaded; None when the record has no samples."""
    tel = doc.get("telemetry") or {}
    if not tel.get("available") or not tel.get("samples"):
        return None
    frame = pd.DataFrame(tel["samples"], columns=tel["fields"])
    t0 = tel.get("t_origin") or frame["t"].min()
    frame["s"] = frame["t"] - t0
    frame["memory_used_bytes"] = frame["memory_used_bytes"] / 2**30
    fig = make_subplots(rows=1 + len(TRACE_ROWS), cols=1, shared_xaxes=True, vertical_spacing=0.03)
    cases = [p for p in tel.get("phases") or [] if p.get("kind") == "case"]
    fig.add_trace(
        go.Scatter(
            x=[(p["t_start"] + p["t_end"]) / 2 - t0 for p in cases],
            y=[p.get("gbs") for p in cases],
            mode="markers",
            name="achieved rate per timed case",
            text=[esc(p["name"]) for p in cases],
            hovertemplate="%{text}<br>%{y:,.0f} GB/s at %{x:.1f} s<extra></extra>",
        ),
        row=1,
        col=1,
    )
    fig.update_yaxes(title_text="GB/s", row=1, col=1)
    for i, (fields, title) in enumerate(TRACE_ROWS, start=2):
        for f in fields:
            fig.add_trace(go.Scatter(x=frame["s"], y=frame[f], mode="lines", name=esc(f)), row=i, col=1)
        fig.update_yaxes(title_text=title, row=i, col=1)
    for p in tel.get("phases") or []:
        if p.get("kind") == "phase":
            fig.add_vrect(x0=p["t_start"] - t0, x1=p["t_end"] - t0, fillcolor="#999", opacity=0.12, line_width=0)
            fig.add_annotation(
                x=p["t_start"] - t0,
                y=1,
                yref="paper",
                text=esc(p["name"]),
                showarrow=False,
                xanchor="left",
                textangle=-90,
                font={"size": 9},
            )
    fig.update_xaxes(title_text="time since the sweep began (s)", row=1 + len(TRACE_ROWS), col=1)
    style(fig, f"{doc.get('machine')}: NVML at {1 / tel['interval_s']:.0f} Hz through the kernel grid", height=1000)
    return fig


def _gib(v) -> str:
    return "—" if v is None else f"{v / 2**30:,.2f} GiB"


def memory_table(doc: dict) -> str:
    """torch.cuda.mem_get_info vs NVML vs the catalog, as the sweep recorded them."""
    mem = doc.get("device_memory")
    if mem is None:
        return note("Device memory: not in this record (it predates the sweep).")
    if not mem.get("available"):
        return note(f"Device memory: {esc(mem.get('reason'))}.")
    nv, cat = mem.get("nvml") or {}, mem.get("catalog") or {}
    rows = [
        ("torch.cuda.mem_get_info", mem["torch"]["total_bytes"], mem["torch"]["free_bytes"]),
        ("NVML" if nv.get("available") else f"NVML ({nv.get('reason')})", nv.get("total_bytes"), nv.get("free_bytes")),
        (f"catalog {cat.get('key')}: device_memory_mib", cat.get("device_memory_bytes"), None),
        (f"catalog {cat.get('key')}: torch total", cat.get("torch_total_bytes"), None),
    ]
    view = pd.DataFrame(
        {"src": [r[0] for r in rows], "total": [_gib(r[1]) for r in rows], "free": [_gib(r[2]) for r in rows]}
    )
    diffs = ", ".join(
        f"{k.replace('_', ' ')} {v:+,.0f}" for k, v in (mem.get("differences_mib") or {}).items() if v is not None
    )
    return table(view, {"src": "source", "total": "total", "free": "free at start"}) + (
        f"<p>Differences (MiB): {esc(diffs)}.</p>" if diffs else ""
    )


def gpu_evidence(doc: dict, page: Page) -> str:
    """The NVML trace (or why it is missing) and the device-memory view of one record."""
    tel = doc.get("telemetry")
    fig = telemetry_figure(doc)
    if fig is not None:
        out = page.plot(fig, f"nvml-{slug(doc.get('machine'))}")
    elif tel is None:
        out = note(
            "NVML trace: not in this record (it predates the sweep, <code>MODE=sweep kernels/run_on_gpu.sh</code>)."
        )
    else:
        out = note(f"NVML trace: {esc(tel.get('reason') or 'no samples')}.")
    return out + memory_table(doc)


def accuracy_figure(rows: pd.DataFrame, doc_machine: str) -> go.Figure:
    order = list(pd.unique(rows["data"]))
    fig = go.Figure()
    for f in ordered(rows["format"]):
        for scale in sorted(rows.loc[rows["format"] == f, "scale"].dropna().unique(), key=lambda s: s != "1"):
            pts = (
                rows[(rows["format"] == f) & (rows["scale"] == scale)]
                .set_index("data")
                .reindex(order)
                .dropna(subset=["rel_l2"])
                .reset_index()
            )
            label = f if scale == "-" else f"{f}, {SCALE_WORDS.get(scale, 'scale ' + str(scale))}"
            fig.add_trace(
                go.Bar(
                    x=[esc(d) for d in pts["data"]],
                    y=pts["rel_l2"],
                    name=esc(label),
                    legendgroup=f,
                    marker={
                        "color": color(f),
                        "pattern": {"shape": SCALE_PATTERNS.get(scale, "."), "fgcolor": "#fff"},
                        "line": {"color": "#333", "width": 0.5},
                    },
                    customdata=[
                        [
                            esc(Path(r["path"]).stem),
                            esc(date_text(r["created_at"])),
                            esc(r["vllm_version"]),
                            esc(r["machine"]),
                            esc(label),
                            esc(r["kind"]),
                            fmt(r["cos_mean"], 5),
                        ]
                        for _, r in pts.iterrows()
                    ],
                    hovertemplate=(
                        "<b>%{customdata[4]}</b> on %{x} (%{customdata[5]})<br>rel. L2 %{y:.4g}, "
                        "mean cosine %{customdata[6]}"
                        "<br>record %{customdata[0]}<br>%{customdata[1]}"
                        "<br>vLLM %{customdata[2]}<br>machine %{customdata[3]}"
                        "<extra></extra>"
                    ),
                )
            )
    fig.update_yaxes(type="log", title_text="attention error vs fp32 (rel. L2, unitless)", dtick=1, tickformat="~g")
    fig.update_xaxes(title_text="data source (synthetic K/V; real MiniLM K/V; MiniLM's own output)")
    style(fig, f"{doc_machine}: error per KV format on each data source (lower is better)", height=520)
    fig.update_layout(
        barmode="group",
        legend={"orientation": "v", "yref": "paper", "x": 1.01, "y": 1, "xanchor": "left", "yanchor": "top"},
        margin={"r": 300},
    )
    return fig


def build(data: SiteData) -> Page:
    page = Page(SLUG, TITLE)
    parts = page.heading(
        """Does dequantizing NVFP4 in the attention kernel cost speed, and how much accuracy does each format give up?
        Kernel bandwidth counts the bytes the kernel must move (cache incl. block scales, q, output) over its median
        time; the roofline is the GPU catalog's HBM bandwidth. Accuracy is attention output vs an fp32 reference."""
    )
    # Kernels
    inner = ""
    if data.kernels.empty:
        inner = empty(
            f"No kernel records under <code>{esc(data.results_dir)}/&lt;machine&gt;/kernels/</code> — run "
            "<code>kvbench kernels</code> on an SM80+ GPU (or <code>OUT=dir kernels/run_on_gpu.sh</code>) and copy the "
            "record in. This results folder holds no GPU kernel timings yet."
        )
    else:
        for doc in _newest_per_machine(data.kernel_records):
            rows = data.kernels[data.kernels["path"] == doc["_path"]]
            if doc.get("mode") == "interpret":
                inner += note(
                    "Triton interpreter on the CPU: these times are a CPU emulation, not GPU times, and there is no "
                    "roofline to compare with.",
                    "warn",
                )
            if rows.empty:
                inner += empty(
                    f"{esc(doc.get('machine'))}: the kernel record holds no timings (status {esc(doc.get('status'))})."
                )
                continue
            inner += page.plot(kernel_figure(doc, rows), f"kernels-{slug(doc.get('machine'))}")
            inner += provenance_note(doc)
            targets = doc.get("targets") or {}
            if targets:
                w = targets.get("write_pct_of_copy") or {}
                a = targets.get("nvfp4_decode_speedup_at_32k") or {}
                inner += note(
                    f"Targets: quantize-write ≥ {fmt(w.get('target'), 0)}% of copy bandwidth — best "
                    + esc(", ".join(f"{k} {v:.1f}%" for k, v in (w.get("best_by_format") or {}).items()) or "—")
                    + f"; nvfp4 decode at 32K ≥ {fmt(a.get('target'), 1)}x fp16 (ideal {fmt(a.get('ideal'), 2)}x) — "
                    + esc(
                        ", ".join(f"batch {b}: {v:.2f}x" for b, v in (a.get("by_batch") or {}).items())
                        or "not measured"
                    )
                    + fp8_words(doc)
                )
            inner += bounds_table(doc) + gpu_evidence(doc, page)
    parts.append(section("Kernel bandwidth vs roofline", inner))
    # Accuracy
    inner = ""
    if data.accuracy.empty:
        inner = empty(
            f"No accuracy records under <code>{esc(data.results_dir)}/&lt;machine&gt;/accuracy/</code> — run "
            "<code>kvbench accuracy</code> (CPU is fine) to fill this section."
        )
    else:
        acc = data.accuracy
        for path in acc.sort_values("created_at").groupby("machine")["path"].last():
            rows = acc[acc["path"] == path]
            machine = rows["machine"].iloc[0]
            inner += page.plot(accuracy_figure(rows, machine), f"accuracy-{slug(machine)}")
            real = rows[rows["kind"] != "synthetic"]
            if not real.empty and real["model"].notna().any():
                inner += (
                    f"<p>Real activations: {esc(real['model'].dropna().iloc[0])}. Record <code>{esc(path)}</code>.</p>"
                )
            view = rows[rows["kind"] == "real K/V"].copy()
            if not view.empty:
                view["fmt"] = [
                    f if s == "-" else f"{f} ({SCALE_WORDS.get(s, s)})"
                    for f, s in zip(view["format"], view["scale"], strict=False)
                ]
                view["rel"] = [fmt(v, 4) for v in view["rel_l2"]]
                view["cos"] = [fmt(v, 5) for v in view["cos_mean"]]
                view["mx"] = [fmt(v, 4) for v in view["max_abs"]]
                inner += table(
                    view, {"fmt": "format", "rel": "rel. L2 (real K/V)", "cos": "mean cosine", "mx": "max abs error"}
                )
    parts.append(section("Accuracy per format and data source", inner))
    return page.done(parts)


def _newest_per_machine(docs: list[dict]) -> list[dict]:
    newest: dict = {}
    for d in docs:  # sorted by created_at
        newest[d.get("machine")] = d
    return [newest[k] for k in sorted(newest, key=str)]
