"""Trade-off: output tokens/s per GPU against tokens/s per user over a concurrency sweep, the Pareto front
per KV dtype and machine, the cost per million tokens where a price was given, and energy where measured.
Newest run per (machine, model, request shape); the curves come from kvbench.core.front in the records."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from kvbench.dashboards.components import (
    Page,
    empty,
    emulated_note,
    fmt,
    hover_data,
    hover_template,
    note,
    section,
    slug,
    table,
)
from kvbench.dashboards.data import SiteData
from kvbench.dashboards.theme import color, esc, ordered, style, symbol

SLUG, TITLE = "tradeoff", "Trade-off"
DASH = ("solid", "dash", "dot", "dashdot")  # one per machine


def newest(fronts: pd.DataFrame) -> pd.DataFrame:
    """Points of the newest run per (machine, model, request shape)."""
    keyed = fronts.assign(setup=[f"{m}: {w}" for m, w in zip(fronts["model"], fronts["workload"], strict=False)])
    last = keyed.sort_values("created_at").groupby(["machine", "setup"])["run_id"].last()
    return keyed[keyed["run_id"].isin(last.values)]


def _series(pts: pd.DataFrame, y: str, name: str) -> dict:
    """A trace's points (tokens/s per user against `y`) and its legend entry, shared by a dtype's points and front."""
    return {"x": pts["user_tps"], "y": pts[y], "name": name, "legendgroup": name}


def front_figure(rows: pd.DataFrame, title: str, y: str, y_title: str) -> go.Figure:
    """Every point (hollow: off the front), lines through each dtype's front, per machine."""
    fig = go.Figure()
    machines = sorted(rows["machine"].unique(), key=str)
    for mi, machine in enumerate(machines):
        for dtype in ordered(rows["kv_cache_dtype"]):
            pts = rows[
                (rows["machine"] == machine)
                & (rows["kv_cache_dtype"] == dtype)
                & rows[y].notna()
                & rows["user_tps"].notna()
            ]
            if pts.empty:
                continue
            emulated = bool(pts["emulated"].fillna(False).astype(bool).any()) if "emulated" in pts else False
            label = f"{dtype} (emulated)" if emulated else dtype
            name = esc(f"{label} · {machine}") if len(machines) > 1 else esc(label)
            # An emulated dtype's points are the emulation's speed: drawn grey and hollow, never as a front.
            on = pts.iloc[0:0] if emulated else pts[pts["on_front"]].sort_values("user_tps")
            custom = hover_data(pts, extra=["concurrency", "kv_cache_dtype", "phase"])
            fig.add_trace(
                go.Scatter(
                    **_series(pts, y, name),
                    mode="markers",
                    showlegend=emulated,
                    opacity=0.4 if emulated else 1.0,
                    marker={
                        "color": color(dtype),
                        "symbol": [
                            symbol(dtype) if f and not emulated else f"{symbol(dtype)}-open" for f in pts["on_front"]
                        ],
                        "size": 9,
                        "line": {"width": 1.5, "color": color(dtype)},
                    },
                    customdata=custom,
                    hovertemplate=hover_template(
                        [
                            "<b>%{customdata[5]}</b> at concurrency %{customdata[4]} (%{customdata[6]})",
                            "%{x:.1f} tokens/s per user",
                            f"%{{y:,.4g}} {esc(y_title)}",
                        ]
                    ),
                )
            )
            fig.add_trace(
                go.Scatter(
                    **_series(on, y, name),
                    mode="lines",
                    line={"color": color(dtype), "dash": DASH[mi % len(DASH)], "width": 2},
                    hoverinfo="skip",
                )
            )
    fig.update_xaxes(title_text="interactivity, 1000 / median TPOT (tokens/s per user)")
    fig.update_yaxes(title_text=esc(y_title))
    return style(fig, title, height=460)


# The chart's div id per quantity: "front" for throughput (the page's first chart), else the quantity's name.
DIV_IDS = {"Throughput": "front", "Cost": "cost", "Energy": "energy"}


def _front_div(page: Page, rows: pd.DataFrame, setup: str, what: str, y: str, y_title: str) -> str:
    """The div of `what` (Throughput, Cost, Energy) against interactivity for one setup."""
    fig = front_figure(rows, f"{what} vs interactivity — {setup}", y, y_title)
    return page.plot(fig, f"{DIV_IDS[what]}-{slug(setup)}")


def build(data: SiteData) -> Page:
    page = Page(SLUG, TITLE)
    parts = page.heading(
        """What serving teams compare GPUs by: output tokens/s per GPU against tokens/s per user over a concurrency
        ladder (<code>kvbench run --sweep</code>), with the KV dtype as an axis. Lines join each dtype's Pareto front
        (filled markers); hollow markers are beaten on both axes by another point. Cost per million output tokens
        appears where the run was given a price (<code>--price-per-hour</code>; kvbench ships none)."""
    )
    if data.fronts.empty:
        parts.append(
            empty(
                f"No run under <code>{esc(data.results_dir)}</code> has a concurrency sweep — run "
                "<code>kvbench run</code> (the sweep is on by default) to draw the front."
            )
        )
        return page.done(parts)
    rows = newest(data.fronts)
    for setup, group in rows.groupby("setup", sort=True):
        inner = ""
        if group["machine"].nunique() == 1:
            inner += note(
                f"One machine ({esc(group['machine'].iloc[0])}) has a front for this setup; run the same sweep on "
                "another GPU and copy its <code>results/&lt;machine&gt;/</code> folder in to compare."
            )
        inner += _front_div(
            page, group, setup, "Throughput", "output_tps_per_gpu", "output throughput (tokens/s per GPU)"
        )
        priced = group[group["usd_per_m_output"].notna()]
        if not priced.empty:
            inner += _front_div(page, priced, setup, "Cost", "usd_per_m_output", "cost (USD per million output tokens)")
            prices = priced.drop_duplicates(["machine", "price_key"])
            inner += note(
                "Prices given to the runs: "
                + ", ".join(
                    f"{esc(m)} {esc(k)} USD {p:g}/h"
                    for m, k, p in zip(
                        prices["machine"], prices["price_key"], prices["price_per_gpu_hour"], strict=False
                    )
                )
            )
        energy = group[group["energy_j_per_output_token"].notna()]
        if not energy.empty:
            title = "energy, NVML (J per output token)"
            inner += _front_div(page, energy, setup, "Energy", "energy_j_per_output_token", title)
        else:
            inner += note(
                "Energy per token: not measured on these machines (no NVML GPU power, no readable RAPL counters)."
            )
        inner += emulated_note(group)
        emulated = group["emulated"].fillna(False).astype(bool) if "emulated" in group else False
        best = group[group["on_front"] & ~emulated].sort_values(["machine", "kv_cache_dtype", "concurrency"]).copy()
        best["usd"] = [fmt(v, 4) for v in best["usd_per_m_output"]]
        best["slo"] = [{True: "met", False: "missed"}.get(v, "—") for v in best["meets_slo"]]
        for col, digits in (("user_tps", 1), ("output_tps_per_gpu", 0), ("ttft_p95_ms", 1), ("tpot_p95_ms", 2)):
            best[f"{col}_t"] = [fmt(v, digits) for v in best[col]]
        inner += table(
            best,
            {
                "machine": "machine",
                "kv_cache_dtype": "KV dtype",
                "concurrency": "concurrency",
                "user_tps_t": "tokens/s per user",
                "output_tps_per_gpu_t": "output tokens/s per GPU",
                "ttft_p95_ms_t": "TTFT P95 (ms)",
                "tpot_p95_ms_t": "TPOT P95 (ms)",
                "slo": "SLO",
                "usd": "USD / M output tokens",
            },
            numeric={"concurrency", "user_tps_t", "output_tps_per_gpu_t", "ttft_p95_ms_t", "tpot_p95_ms_t", "usd"},
        )
        parts.append(section(str(setup), inner))
    return page.done(parts)
