"""Latency under load: TTFT and TPOT P95 vs concurrency per dtype, the SLO line and the knee (the highest
concurrency that met the SLO in the run's search)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvbench.core.errors import KvbenchError
from kvbench.dashboards.components import (
    Page,
    date_text,
    dtype_chip,
    empty,
    emulated_note,
    is_missing,
    note,
    section,
    slug,
)
from kvbench.dashboards.data import SiteData, newest_record_per_machine
from kvbench.dashboards.theme import SLO_COLOR, color, dash, esc, log_ticks, ordered, style, symbol

SLUG, TITLE = "latency", "Latency under load"
PANELS = (("ttft_p95_ms", "TTFT P95", "ttft_p95_ms"), ("tpot_p95_ms", "TPOT P95", "tpot_p95_ms"))


def latency_figure(doc: dict, probes: pd.DataFrame, x: str = "concurrency") -> go.Figure:
    """P95s vs `x`: "concurrency" (closed loop: SLO search and fixed loads) or "rate_rps" (open-loop fixed loads)."""
    slo = (doc.get("config") or {}).get("slo") or {}
    by_rate = x == "rate_rps"
    probes = probes.dropna(subset=[x])
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=[f"{t} vs {'request rate' if by_rate else 'concurrency'} (ms)" for _, t, _ in PANELS],
        horizontal_spacing=0.09,
    )
    for col, (key, title, slo_key) in enumerate(PANELS, start=1):
        for dtype in ordered(probes["kv_cache_dtype"]):
            pts = probes[probes["kv_cache_dtype"] == dtype].sort_values([x, "order"])
            emulated = bool(pts["emulated"].fillna(False).astype(bool).any()) if "emulated" in pts else False
            custom = [
                [
                    esc(r["run_id"]),
                    esc(date_text(r["created_at"])),
                    esc(r["vllm_version"]),
                    esc(r["machine"]),
                    esc(dtype),
                    esc(r["phase"]),
                    esc("met" if r["met"] else ("missed" if r["met"] is False else "no SLO")),
                    esc(r["why"]),
                    "—" if is_missing(r["completed"]) else int(r["completed"]),
                    "—" if is_missing(r["failed"]) else int(r["failed"]),
                ]
                for _, r in pts.iterrows()
            ]
            fig.add_trace(
                go.Scatter(
                    x=pts[x],
                    y=pts[key],
                    mode="lines+markers",
                    name=esc(f"{dtype} (emulated)" if emulated else dtype),
                    legendgroup=dtype,
                    showlegend=col == 1,
                    opacity=0.4 if emulated else 1.0,  # the emulation's latency: kept, greyed
                    line={"color": color(dtype), "dash": dash(dtype), "width": 1.5},
                    marker={
                        "color": color(dtype),
                        "size": 11,
                        "line": {"color": color(dtype), "width": 2},
                        # filled: met the SLO; open: missed it
                        "symbol": [symbol(dtype) if m else f"{symbol(dtype)}-open" for m in pts["met"]],
                    },
                    customdata=custom,
                    hovertemplate=(
                        f"<b>%{{customdata[4]}}</b> {esc(title)}: %{{y:.1f}} ms at "
                        + ("%{x} requests/s" if by_rate else "concurrency %{x}")
                        + "<br>phase %{customdata[5]}: "
                        "%{customdata[6]} (%{customdata[7]})<br>%{customdata[8]} completed, %{customdata[9]} failed<br>"
                        "run %{customdata[0]}<br>%{customdata[1]}"
                        "<br>vLLM %{customdata[2]}<br>machine %{customdata[3]}<extra></extra>"
                    ),
                ),
                row=1,
                col=col,
            )
            knee = pts["knee"].dropna()
            if not by_rate and len(knee) and knee.iloc[0] > 0:
                k = int(knee.iloc[0])
                fig.add_vline(x=k, line={"color": color(dtype), "dash": "dot", "width": 2}, row=1, col=col)
                # Placed by hand: on a log axis plotly puts a vline's own annotation at 10**x.
                sfx = "" if col == 1 else str(col)
                fig.add_annotation(
                    x=math.log10(k),
                    xref=f"x{sfx}",
                    y=1,
                    yref=f"y{sfx} domain",
                    text=f"knee {esc(dtype)}: {k}",
                    showarrow=False,
                    textangle=-90,
                    xanchor="right",
                    yanchor="top",
                    font={"color": color(dtype), "size": 11},
                )
        bound = slo.get(slo_key)
        if bound is not None:
            fig.add_hline(
                y=bound,
                line={"color": SLO_COLOR, "dash": "dash", "width": 2},
                row=1,
                col=col,
                annotation={"text": f"SLO {bound:g} ms", "font": {"color": SLO_COLOR}, "xanchor": "right"},
                annotation_position="top right",
            )
        if by_rate:
            fig.update_xaxes(title_text="request rate (requests/s)", rangemode="tozero", row=1, col=col)
        else:
            fig.update_xaxes(
                type="log",
                title_text="concurrent requests (requests)",
                row=1,
                col=col,
                tickvals=log_ticks(probes[x].min(), probes[x].max()),
                tickformat=",d",
            )
        fig.update_yaxes(title_text=f"{title} (ms)", rangemode="tozero", row=1, col=col)
    style(fig, f"{doc.get('machine')}: P95 latency vs {'request rate' if by_rate else 'concurrency'}", height=460)
    return fig


def knee_text(doc: dict) -> str:
    out = []
    for d in doc.get("dtypes") or []:
        measured = (d.get("capacity") or {}).get("measured")
        dt = d.get("kv_cache_dtype")
        if measured is None:
            out.append(
                f"{dtype_chip(dt)}: no completed SLO search"
                + (f" — <b>{esc(d.get('status'))}</b>: {esc(d.get('error'))}" if d.get("status") != "ok" else "")
            )
        elif measured.get("max_concurrency") == 0:
            out.append(f"{dtype_chip(dt)}: no knee — even concurrency 1 missed the SLO")
        else:
            out.append(
                f"{dtype_chip(dt)}: knee at {int(measured['max_concurrency'])} requests"
                + (" (the search cap; the true knee may be higher)" if measured.get("capped") else "")
            )
    return "<ul>" + "".join(f"<li>{x}</li>" for x in out) + "</ul>"


def length_scatter(doc: dict) -> go.Figure | None:
    """TTFT of every request of the fixed phases against its prompt length, per dtype (from the run's samples)."""
    from kvbench.records import samples_frame

    path = doc.get("_path")
    req = samples_frame([Path(path)]) if path else None  # a damaged file raises its one line (K-P13)
    if req is None or req.empty:
        return None
    req = req[(req["phase_kind"] == "fixed") & ~req["warmup"] & req["ok"] & req["ttft_s"].notna()]
    if req.empty:
        return None
    fig = go.Figure()
    for dtype in ordered(req["kv_cache_dtype"]):
        pts = req[req["kv_cache_dtype"] == dtype]
        x = pts["prompt_tokens"].fillna(pts["expected_prompt_tokens"])
        fig.add_trace(
            go.Scattergl(
                x=x,
                y=pts["ttft_s"] * 1e3,
                mode="markers",
                name=esc(dtype),
                marker={"color": color(dtype), "symbol": symbol(dtype), "size": 5, "opacity": 0.6},
                hovertemplate=f"<b>{esc(dtype)}</b><br>%{{x}} prompt tokens<br>TTFT %{{y:.1f}} ms<extra></extra>",
            )
        )
    fig.update_xaxes(title_text="prompt length (tokens)")
    fig.update_yaxes(title_text="TTFT (ms)")
    return style(fig, "TTFT by prompt length, every request of the fixed load", height=380)


def build(data: SiteData) -> Page:
    page = Page(SLUG, TITLE)
    parts = page.heading(
        """P95 time to first token and time per output token as concurrency rises, from the SLO search of the newest run
        per machine (phases <code>slo-c&lt;N&gt;</code>) and its fixed closed-loop load. Filled markers met the SLO,
        open ones missed it; the dashed line is the SLO; the dotted line per dtype is its knee, the highest
        concurrency that met the SLO."""
    )
    if not data.records:
        parts.append(
            empty(
                f"No run records under <code>{esc(data.results_dir)}</code> — run <code>kvbench run</code> (its SLO "
                "search probes rising concurrency) to fill this page."
            )
        )
        return page.done(parts)
    for doc in newest_record_per_machine(data.records):
        machine = doc.get("machine")
        probes = data.probes[data.probes["run_id"] == doc.get("run_id")] if not data.probes.empty else data.probes
        slo = (doc.get("config") or {}).get("slo")
        inner = ""
        if not slo:
            inner += note("This run set no SLO, so there is no search and no knee.", "warn")
        inner += knee_text(doc)
        inner += emulated_note(probes.drop_duplicates("kv_cache_dtype")) if not probes.empty else ""
        closed = probes[probes["concurrency"].notna()] if not probes.empty else probes
        opened = probes[probes["rate_rps"].notna()] if not probes.empty else probes
        if closed.empty and opened.empty:
            inner += empty(
                "This run has no load phases at fixed concurrency or rate — run <code>kvbench run</code> with an "
                "SLO to search for the knee."
            )
        if not closed.empty:
            inner += page.plot(latency_figure(doc, closed), f"latency-{slug(machine)}")
        if not opened.empty:
            inner += page.plot(latency_figure(doc, opened, x="rate_rps"), f"latency-rate-{slug(machine)}")
        if (doc.get("config") or {}).get("workload_spec"):  # variable lengths: each request's TTFT by its prompt
            try:
                scatter = length_scatter(doc)
            except KvbenchError as exc:  # a damaged samples file: said as such, on the page and in skipped:
                data.problems.append(str(exc))
                inner += note(f"Per-request samples of this run cannot be read: {esc(str(exc))}", "warn")
            else:
                inner += (
                    page.plot(scatter, f"latency-lengths-{slug(machine)}")
                    if scatter is not None
                    else note(
                        "Per-request samples of this run are not on this disk (they are kept beside the record as "
                        "Parquet, not committed): no TTFT-by-prompt-length view."
                    )
                )
        from kvbench.records import workload_label

        title = f"{machine} — {workload_label(doc.get('config') or {})} — run {doc.get('run_id')}"
        parts.append(section(title, inner, anchor=f"m-{machine}"))
    return page.done(parts)
