"""Capacity: max concurrency vs context per dtype. The capacity model (kvbench.specs.capacity) for the run's model,
KV budget and block size gives the lines; the engine's report and the SLO search give the points. A dtype
the engine did not honour shows up as an engine point far off its own line."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from kvbench.core.errors import KvbenchError
from kvbench.dashboards.components import (
    Page,
    date_text,
    dtype_chip,
    empty,
    emulated_note,
    fmt,
    is_missing,
    note,
    section,
    slug,
    speed,
    table,
    text,
)
from kvbench.dashboards.data import SiteData, newest_record_per_machine
from kvbench.dashboards.menu_view import menu_section
from kvbench.dashboards.record_rows import model_spec
from kvbench.dashboards.theme import color, dash, esc, log_ticks, ordered, style, symbol
from kvbench.records import workload_label
from kvbench.records.findings import FindingKind
from kvbench.specs.capacity import budget_from_bytes, capacity_row
from kvbench.specs.formats import get_format

SLUG, TITLE = "capacity", "Capacity"
POINTS_PER_LINE = 48


def context_grid(block: int, run_context: int, longest: int | None) -> list[int]:
    """Contexts for the model lines: one block up to the model's longest context (or 8x the run's), plus the run's."""
    top = max(run_context * 2, longest or run_context * 8)
    grid = np.unique(np.geomspace(max(1, block), top, POINTS_PER_LINE).astype(int))
    return sorted(set(grid.tolist()) | {int(run_context)})


def model_lines(doc: dict) -> tuple[pd.DataFrame, str | None]:
    """(context, dtype, max_concurrency) from the capacity model for the run's model and engine budget,
    or an empty frame and the reason."""
    cfg = doc.get("config") or {}
    spec = model_spec(cfg.get("model_name"), cfg.get("model"))
    if spec is None:
        return (
            pd.DataFrame(),
            f"model {cfg.get('model_name') or cfg.get('model')!r} is not on this machine nor in kvbench's catalog",
        )
    blocks = {d.get("kv_cache_dtype"): ((d.get("capacity") or {}).get("model") or {}) for d in doc.get("dtypes") or []}
    known = [b for b in blocks.values() if b.get("budget_bytes") and b.get("block_size")]
    if not known:
        return pd.DataFrame(), "the engine reported no KV budget in this run"
    rows = []
    for dtype in ordered(blocks):
        b = blocks[dtype] if blocks[dtype].get("budget_bytes") else known[0]  # same engine budget for every dtype
        try:
            fmt_ = get_format(dtype)
        except KvbenchError:
            continue
        budget = budget_from_bytes(b["budget_bytes"], "engine's KV memory")
        for ctx in context_grid(
            b["block_size"], b.get("context") or cfg.get("max_model_len") or 1024, spec.max_position_embeddings
        ):
            row = capacity_row(spec, fmt_, ctx, budget, block_size=b["block_size"])
            rows.append(
                {
                    "kv_cache_dtype": dtype,
                    "context": ctx,
                    "max_concurrency": row.max_concurrency,
                    "budget_bytes": b["budget_bytes"],
                    "block_size": b["block_size"],
                }
            )
    return pd.DataFrame(rows), None


def capacity_figure(doc: dict, lines: pd.DataFrame, runs: pd.DataFrame) -> go.Figure:
    fig = go.Figure()
    env = doc.get("environment") or {}
    base = [
        esc(doc.get("run_id")),
        esc(date_text(pd.Timestamp(doc.get("created_at")))),
        esc((env.get("vllm") or {}).get("version")),
        esc(doc.get("machine")),
    ]
    std = "run %{customdata[0]}<br>%{customdata[1]}<br>vLLM %{customdata[2]}<br>machine %{customdata[3]}<extra></extra>"
    for dtype in ordered(lines["kv_cache_dtype"]) if not lines.empty else []:
        ln = lines[lines["kv_cache_dtype"] == dtype]
        fig.add_trace(
            go.Scatter(
                x=ln["context"],
                y=ln["max_concurrency"],
                mode="lines",
                name=f"{esc(dtype)}: capacity model",
                legendgroup=dtype,
                line={"color": color(dtype), "dash": dash(dtype), "width": 2},
                customdata=[base + [esc(dtype)]] * len(ln),
                hovertemplate="<b>%{customdata[4]}</b>, capacity model<br>%{x:,} tokens: %{y:.2f} requests<br>" + std,
            )
        )
    rows = runs[runs["run_id"] == doc.get("run_id")]
    for _, r in rows.iterrows():
        dtype = r["kv_cache_dtype"]
        ctx = r["context"]
        if is_missing(ctx):
            continue
        custom = [base + [esc(dtype), esc(r["status"])]]
        if not is_missing(r["engine_max_concurrency"]):
            fig.add_trace(
                go.Scatter(
                    x=[ctx],
                    y=[r["engine_max_concurrency"]],
                    mode="markers",
                    name=f"{esc(dtype)}: engine-reported",
                    legendgroup=dtype,
                    marker={
                        "color": color(dtype),
                        "symbol": symbol(dtype),
                        "size": 15,
                        "line": {"color": "#222", "width": 1.5},
                    },
                    customdata=custom,
                    hovertemplate=(
                        "<b>%{customdata[4]}</b>, engine-reported (status %{customdata[5]})<br>"
                        "%{x:,} tokens: %{y:.2f} requests<br>"
                    )
                    + std,
                )
            )
        m = r["measured_max_concurrency"]
        if not is_missing(m) and m > 0:
            emulated = bool(r.get("emulated"))
            fig.add_trace(
                go.Scatter(
                    x=[ctx],
                    y=[m],
                    mode="markers",
                    name=f"{esc(dtype)}: measured under the SLO" + (" (emulated speed)" if emulated else ""),
                    legendgroup=dtype,
                    opacity=0.4 if emulated else 1.0,
                    marker={
                        "color": color(dtype),
                        "symbol": f"{symbol(dtype)}-open",
                        "size": 26,
                        "line": {"width": 3},
                    },  # a ring around the engine point when they agree
                    customdata=custom,
                    hovertemplate="<b>%{customdata[4]}</b>, measured under the SLO<br>%{x:,} tokens: %{y} requests<br>"
                    + std,
                )
            )
    # The finding, on the plot: the engine point of a dtype that was probably not honoured.
    for f in doc.get("findings") or []:
        if f.get("kind") != FindingKind.NOT_HONOURED:
            continue
        hit = rows[rows["kv_cache_dtype"] == f.get("dtype")]
        if hit.empty or is_missing(hit["engine_max_concurrency"].iloc[0]) or is_missing(hit["context"].iloc[0]):
            continue
        fig.add_annotation(
            x=np.log10(hit["context"].iloc[0]),
            y=np.log10(hit["engine_max_concurrency"].iloc[0]),
            text=(
                f"<b>{esc(f.get('dtype'))} probably NOT honoured</b>: "
                f"engine holds {f.get('engine_ratio', float('nan')):.2f}x auto's "
                f"tokens; the format implies {f.get('format_ratio', float('nan')):.2f}x"
            ),
            showarrow=True,
            arrowhead=2,
            arrowcolor="#D55E00",
            ax=-40,
            ay=-70,
            bgcolor="#fdf0e8",
            bordercolor="#D55E00",
            font={"size": 12, "color": "#7a2e00"},
            align="left",
        )
    xs = [*lines.get("context", []), *rows["context"].dropna()]
    ys = [
        *lines.get("max_concurrency", []),
        *rows["engine_max_concurrency"].dropna(),
        *rows["measured_max_concurrency"].dropna(),
    ]
    ys = [y for y in ys if y > 0]
    fig.update_xaxes(
        type="log",
        title_text="context per request (tokens)",
        tickvals=log_ticks(min(xs, default=0), max(xs, default=0)),
        tickformat=",d",
    )
    fig.update_yaxes(
        type="log",
        title_text="max concurrent requests at that context (requests)",
        tickvals=log_ticks(min(ys, default=0), max(ys, default=0)),
        tickformat=",.4~g",
    )
    style(fig, f"{doc.get('machine')}: max concurrency vs context", height=520)
    fig.update_layout(
        legend={"orientation": "v", "yref": "paper", "y": 1, "x": 1.01, "yanchor": "top", "xanchor": "left"},
        margin={"r": 260},
    )
    return fig


def run_table(rows: pd.DataFrame) -> str:
    view = rows.copy()
    view["dtype_html"] = [dtype_chip(d) for d in view["kv_cache_dtype"]]
    view["ctx"] = [fmt(v, 0) for v in view["context"]]
    view["model_c"] = [fmt(v, 2) for v in view["model_max_concurrency"]]
    view["engine_c"] = [fmt(v, 2) for v in view["engine_max_concurrency"]]
    emu = view["emulated"] if "emulated" in view else [False] * len(view)
    view["measured_c"] = [
        speed("—" if is_missing(v) else ("0 (misses the SLO at 1)" if v == 0 else f"{int(v)}{'+' if c else ''}"), e)
        for v, c, e in zip(view["measured_max_concurrency"], view["measured_capped"], emu, strict=False)
    ]
    view["engine_model"] = [
        fmt(e / m, 2, "x") if not (is_missing(e) or is_missing(m) or not m) else "—"
        for e, m in zip(view["engine_max_concurrency"], view["model_max_concurrency"], strict=False)
    ]
    view["budget"] = [fmt(b / 1e6, 2, "MB") if not is_missing(b) else "—" for b in view["budget_bytes"]]
    return table(
        view,
        {
            "dtype_html": "KV dtype",
            "status": "status",
            "ctx": "context (tokens)",
            "model_c": "capacity model (requests)",
            "engine_c": "engine-reported (requests)",
            "engine_model": "engine / model",
            "measured_c": "measured under the SLO (requests)",
            "budget": "engine KV budget (10^6 B)",
            "block_size": "block (tokens)",
        },
        raw={"dtype_html", "measured_c"},
        numeric={"ctx", "model_c", "engine_c", "engine_model", "measured_c", "budget", "block_size"},
    )


def build(data: SiteData) -> Page:
    page = Page(SLUG, TITLE)
    parts = page.heading(
        """How many requests fit, per KV dtype, as the context grows. Lines: kvbench's capacity model (vLLM's page
        accounting) for the run's model, the KV budget the engine actually gave the cache and its block size. Filled
        points: what the engine reported at start. Open points: the highest concurrency the SLO search measured. An
        engine point that sits on another dtype's line means the engine did not store that dtype."""
    )
    if not data.records:
        parts.append(
            empty(
                f"No run records under <code>{esc(data.results_dir)}</code> — run <code>kvbench run</code> to measure "
                "capacity; <code>kvbench capacity --model M --gpu G --context N</code> "
                "gives the model's prediction alone."
            )
        )
        parts.append(menu_section())
        return page.done(parts)
    for doc in newest_record_per_machine(data.records):
        machine = doc.get("machine")
        inner = ""
        for f in doc.get("findings") or []:
            inner += note(f"⚠ {esc(f.get('text'))}", "finding")
        lines, why = model_lines(doc)
        rows = data.runs[data.runs["run_id"] == doc.get("run_id")]
        if why:
            inner += note(f"No capacity-model lines: {esc(why)}.", "warn")
        if lines.empty and rows["engine_max_concurrency"].isna().all():
            inner += empty(
                "This run has no capacity numbers (every dtype failed before the engine reported) — see its record."
            )
        else:
            inner += page.plot(capacity_figure(doc, lines, data.runs), f"capacity-{slug(machine)}")
        zero = rows[rows["measured_max_concurrency"] == 0]
        if not zero.empty:
            inner += note(
                f"Measured under the SLO is 0 for {esc(', '.join(ordered(zero['kv_cache_dtype'])))}: even one request "
                "at a time missed the SLO on this machine, so those points cannot show on a log axis.",
                "warn",
            )
        for _, r in rows[rows["status"] != "ok"].iterrows():
            inner += note(
                f"{dtype_chip(r['kv_cache_dtype'])} <b>{esc(r['status'])}</b>: {esc(r['error'])}"
                + (f"<pre>{esc(r['log_tail'])}</pre>" if text(r.get("log_tail")) else ""),
                "warn",
            )
        inner += emulated_note(rows) + run_table(rows)
        title = f"{machine} — run {doc.get('run_id')}, {workload_label(doc.get('config') or {})}"
        parts.append(section(title, inner, anchor=f"m-{machine}"))
    parts.append(menu_section())
    return page.done(parts)
