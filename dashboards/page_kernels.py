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


def _gbs_trace(pts: pd.DataFrame, x: str, f: str, show: bool, hover: str, ident: tuple) -> go.Scatter:
    """Format f's achieved GB/s along column `x`. hover: the kernel's words before the token count
    ('decode: ... GB/s at'); ident: (machine, run id, vLLM version) for _custom."""
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
            _custom(r, *ident, [f, fmt(r["time_us"], 1), fmt(r["pct_of_peak"], 1, "%")]) for _, r in pts.iterrows()
        ],
        hovertemplate=(
            f"<b>%{{customdata[4]}}</b> {hover} %{{x:,}} tokens<br>%{{customdata[5]}} µs, %{{customdata[6]}} of peak"
        )
        + STD_HOVER,
    )


def _log_x(fig: go.Figure, col: int, title: str, values: pd.Series) -> None:
    """Subplot `col`'s x axis: log scale with whole-number ticks spanning `values` (none when it is empty)."""
    ticks = log_ticks(values.min(), values.max()) if not values.empty else None
    fig.update_xaxes(type="log", title_text=title, row=1, col=col, tickformat=",d", tickvals=ticks)


def kernel_figure(doc: dict, rows: pd.DataFrame) -> go.Figure:
    machine, run_id = doc.get("machine"), Path(doc["_path"]).stem
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
                _gbs_trace(pts, "context", f, f not in shown, "decode: %{y:,.1f} GB/s at", ident), row=1, col=col
            )
            shown.add(f)
        _log_x(fig, col, "context (tokens)", dec["context"])
    wr = rows[rows["kernel"] == "write"]
    wcol = len(titles)
    for f in ordered(wr["format"]):
        pts = wr[wr["format"] == f].sort_values("tokens")
        fig.add_trace(_gbs_trace(pts, "tokens", f, f not in shown, "write: %{y:,.1f} GB/s for", ident), row=1, col=wcol)
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
                )
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
