"""History: each tracked metric over commits per machine and dtype, with vLLM releases and regressions marked."""

from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvbench.dashboards.components import (
    Page,
    date_text,
    dtype_chip,
    empty,
    fmt,
    note,
    section,
    slug,
    table,
    text,
    vline,
)
from kvbench.dashboards.data import REGRESSION, SiteData
from kvbench.dashboards.theme import REGRESSION_COLOR, color, dash, dtype_sort_key, esc, ordered, style, symbol
from kvbench.records.repeats import half_width

SLUG, TITLE = "history", "History"
# Latency metrics are stored in seconds (asv's unit); people read them in ms.
DISPLAY_UNITS = {"seconds": ("ms", 1e3)}
MAX_LABELLED_TICKS = 14  # beyond this, date ticks with release lines only


def display_unit(unit: str) -> tuple[str, float]:
    return DISPLAY_UNITS.get(unit, (unit, 1.0))


def boundaries(points: pd.DataFrame) -> list[tuple]:
    """(x between the last point of one vLLM version and the first of the next, new version, old version)."""
    firsts = points.dropna(subset=["when"]).sort_values("when").drop_duplicates("when")
    out, prev = [], None
    for _, r in firsts.iterrows():
        if prev is not None and r["vllm_version"] != prev["vllm_version"]:
            mid = prev["when"] + (r["when"] - prev["when"]) / 2
            out.append((mid, r["vllm_version"], prev["vllm_version"]))
        prev = r
    return out


def _flagged(regressions: pd.DataFrame) -> pd.DataFrame:
    if regressions.empty:
        return regressions
    return regressions[regressions["verdict"] == REGRESSION]


def _regression_points(regs: pd.DataFrame, points: pd.DataFrame) -> pd.DataFrame:
    """The history point each regression judged: by run id where it has one, else by commit."""
    keys = ["machine", "metric", "kv_dtype"]
    by_run = regs.dropna(subset=["run_id"]).merge(points, on=[*keys, "run_id"], how="inner", suffixes=("", "_h"))
    by_commit = regs[regs["run_id"].isna()].merge(points, on=[*keys, "commit"], how="inner", suffixes=("", "_h"))
    hits = pd.concat([by_run, by_commit], ignore_index=True)
    if "run_id_h" in hits:
        hits["run_id"] = hits["run_id"].fillna(hits["run_id_h"])
    return hits


def regressions_table(flagged: pd.DataFrame, link: str = "") -> str:
    """What `kvbench regress` flagged, in the units the charts use, each linked to its metric's chart."""
    view = flagged.copy()
    units = [display_unit(u) for u in (view["unit"] if "unit" in view else [""] * len(view))]
    view["metric_html"] = [
        f'<a href="{link}#{slug(m)}">{esc(text(lbl) or m)}</a>'
        for m, lbl in zip(view["metric"], view["label"] if "label" in view else view["metric"], strict=False)
    ]
    view["newest_v"] = [f"{v * f:,.4g} {u}" for v, (u, f) in zip(view["newest"], units, strict=False)]
    view["baseline_v"] = [f"{v * f:,.4g} {u}" for v, (u, f) in zip(view["baseline"], units, strict=False)]
    view["change"] = [fmt(v, 1, "%") for v in view["change_pct"]]
    view["dtype_html"] = [dtype_chip(d) for d in view["kv_dtype"]]
    view["commit7"] = [text(c)[:10] for c in view["commit"]]
    view["versions"] = [
        f"{text(b) or '?'} → {text(n) or '?'}"
        for b, n in zip(
            view.get("baseline_vllm_versions", [None] * len(view)),
            view.get("vllm_version", [None] * len(view)),
            strict=False,
        )
    ]
    return table(
        view,
        {
            "machine": "machine",
            "metric_html": "metric",
            "dtype_html": "KV dtype",
            "newest_v": "newest",
            "baseline_v": "baseline (median)",
            "change": "change",
            "direction": "better is",
            "versions": "vLLM (baseline → newest)",
            "commit7": "commit",
            "run_id": "run",
        },
        raw={"metric_html", "dtype_html"},
        numeric={"newest_v", "baseline_v", "change"},
    )


def _regression_trace(
    hits: pd.DataFrame, factor: float, machine: str, size: int, showlegend: bool, unit: str | None = None
) -> go.Scatter:
    """A ring around each point `kvbench regress` flagged; with `unit`, the hover also gives the baseline."""
    custom = []
    for _, h in hits.iterrows():
        row = [
            esc(h["run_id"]),
            esc(date_text(h["when"])),
            esc(h["vllm_version"]),
            esc(machine),
            esc(h["kv_dtype"]),
            fmt(h["change_pct"], 1, "%"),
        ]
        if unit is not None:
            row.append(fmt(h["baseline"] * factor, 4))
        custom.append(row)
    baseline = "" if unit is None else f" vs baseline %{{customdata[6]}} {esc(unit)}"
    return go.Scatter(
        x=hits["when"],
        y=hits["value"] * factor,
        mode="markers",
        name="regression (kvbench regress)",
        legendgroup="regression",
        showlegend=showlegend,
        marker={"symbol": "circle-open", "size": size, "color": REGRESSION_COLOR, "line": {"width": 3}},
        customdata=custom,
        hovertemplate=(
            f"<b>regression</b> %{{customdata[4]}}: %{{customdata[5]}}{baseline}<br>run %{{customdata[0]}}"
            "<br>%{customdata[1]}<br>vLLM %{customdata[2]}<br>machine %{customdata[3]}<extra></extra>"
        ),
    )


def _repeat_bars(pts: pd.DataFrame, factor: float) -> dict | None:
    """Error bars where a point's run repeated its fixed load: the 95% t interval of the mean of the repeats."""
    if "repeat_std" not in pts or "repeat_n" not in pts:
        return None
    half = [
        half_width(s, int(n)) * factor if n == n and n >= 2 and s == s else math.nan
        for s, n in zip(pts["repeat_std"], pts["repeat_n"], strict=False)
    ]
    if all(h != h for h in half):
        return None
    return {"type": "data", "array": half, "visible": True, "thickness": 1.2, "width": 4}


def _dtype_line(pts: pd.DataFrame, dtype: str, factor: float, showlegend: bool, look: dict, custom, hover: str):
    """One dtype's points over time, in its colour, dash and marker; look: the line's width, the markers' size
    and (optionally) their outline."""
    marker = {"color": color(dtype), "symbol": symbol(dtype), "size": look["size"]}
    if "line" in look:
        marker["line"] = look["line"]
    return go.Scatter(
        x=pts["when"],
        y=pts["value"] * factor,
        error_y=_repeat_bars(pts, factor),
        mode="lines+markers",
        name=esc(dtype),
        legendgroup=dtype,
        showlegend=showlegend,
        line={"color": color(dtype), "dash": dash(dtype), "width": look["width"]},
        marker=marker,
        customdata=custom,
        hovertemplate=hover,
    )


def metric_figure(frame: pd.DataFrame, regressions: pd.DataFrame, title: str, unit: str) -> go.Figure:
    metric = frame["metric"].iloc[0]
    shown_unit, factor = display_unit(unit)
    machines = sorted(frame["machine"].unique(), key=str)
    one = len(machines) == 1  # then the machine goes in the title, not above a lone subplot
    fig = make_subplots(
        rows=len(machines),
        cols=1,
        subplot_titles=None if one else [esc(m) for m in machines],
        vertical_spacing=0.1 if one else 0.16 / (len(machines) - 1),
    )
    legend_done: set[str] = set()
    flagged = _flagged(regressions)
    for row, machine in enumerate(machines, start=1):
        mframe = frame[frame["machine"] == machine]
        for dtype in ordered(mframe["kv_dtype"]):
            pts = mframe[mframe["kv_dtype"] == dtype].sort_values("when")
            custom = [
                [
                    esc(r["run_id"]),
                    esc(date_text(r["when"])),
                    esc(r["vllm_version"]),
                    esc(machine),
                    esc(str(r["commit"])[:10]),
                    esc(dtype),
                    esc(date_text(r["commit_date"])),
                ]
                for _, r in pts.iterrows()
            ]
            hover = (
                f"<b>%{{customdata[5]}}</b>: %{{y:.4g}} {esc(shown_unit)}<br>commit %{{customdata[4]}} "
                "(%{customdata[6]})<br>run %{customdata[0]}<br>%{customdata[1]}<br>vLLM %{customdata[2]}"
                "<br>machine %{customdata[3]}<extra></extra>"
            )
            big = {"width": 2, "size": 9, "line": {"color": "#fff", "width": 1}}
            fig.add_trace(_dtype_line(pts, dtype, factor, dtype not in legend_done, big, custom, hover), row=row, col=1)
            legend_done.add(dtype)
        # Regressions `kvbench regress` found: a ring around the newest point it judged.
        mreg = flagged[flagged["machine"] == machine] if not flagged.empty else flagged
        if not mreg.empty:
            hits = _regression_points(mreg, mframe)
            if not hits.empty:
                fig.add_trace(
                    _regression_trace(
                        hits, factor, machine, size=22, showlegend="regression" not in legend_done, unit=shown_unit
                    ),
                    row=row,
                    col=1,
                )
                legend_done.add("regression")
        # vLLM release boundaries and the version under every point.
        for x, new, old in boundaries(mframe):
            vline(fig, x, {"color": "#666", "dash": "dot", "width": 1.5}, row, 1)
            fig.add_annotation(
                x=x,
                y=1,
                yref=f"y{'' if row == 1 else row} domain",
                text=f"vLLM {esc(old)} → {esc(new)}",
                showarrow=False,
                xanchor="left",
                yanchor="top",
                xshift=3,
                font={"size": 11, "color": "#444"},
                bgcolor="rgba(255,255,255,0.85)",
                row=row,
                col=1,
            )
        ticks = mframe.dropna(subset=["when"]).drop_duplicates("when").sort_values("when")
        if 0 < len(ticks) <= MAX_LABELLED_TICKS:
            fig.update_xaxes(
                tickvals=list(ticks["when"]),
                ticktext=[f"vLLM {esc(r['vllm_version'])}<br>{esc(str(r['commit'])[:7])}" for _, r in ticks.iterrows()],
                row=row,
                col=1,
            )
        fig.update_xaxes(title_text="date measured (UTC; ticks: vLLM version and kvbench commit)", row=row, col=1)
        fig.update_yaxes(title_text=f"{esc(metric)} ({esc(shown_unit)})", row=row, col=1)
    style(fig, f"{title} ({shown_unit})" + (f" — {machines[0]}" if one else ""), height=160 + 270 * len(machines))
    return fig


GLANCE_COLS = 3


def glance_figure(frame: pd.DataFrame, regressions: pd.DataFrame, metrics: list[str]) -> go.Figure:
    """Every tracked metric of one machine as small multiples, so a release's effect shows at a glance."""
    machine = frame["machine"].iloc[0]
    metrics = [m for m in metrics if frame.loc[frame["metric"] == m, "value"].notna().any()]
    rows = math.ceil(len(metrics) / GLANCE_COLS)
    labels = {m: frame.loc[frame["metric"] == m, "label"].iloc[0] for m in metrics}
    fig = make_subplots(
        rows=rows,
        cols=GLANCE_COLS,
        subplot_titles=[esc(labels[m]) for m in metrics],
        vertical_spacing=0.32 / rows,
        horizontal_spacing=0.08,
    )
    flagged = _flagged(regressions)
    shown: set[str] = set()
    ticks = frame.dropna(subset=["when"]).drop_duplicates("when").sort_values("when")
    for i, metric in enumerate(metrics):
        r, c = divmod(i, GLANCE_COLS)
        mf = frame[(frame["metric"] == metric)].dropna(subset=["value"])
        unit, factor = display_unit(mf["unit"].iloc[0])
        for dtype in ordered(mf["kv_dtype"]):
            pts = mf[mf["kv_dtype"] == dtype].sort_values("when")
            custom = [
                [esc(p["run_id"]), esc(date_text(p["when"])), esc(p["vllm_version"]), esc(machine), esc(dtype)]
                for _, p in pts.iterrows()
            ]
            hover = (
                "<b>%{customdata[4]}</b>: "
                f"%{{y:.4g}} {esc(unit)}<br>run %{{customdata[0]}}<br>%{{customdata[1]}}"
                "<br>vLLM %{customdata[2]}<br>machine %{customdata[3]}<extra></extra>"
            )
            small = {"width": 1.5, "size": 7}
            line = _dtype_line(pts, dtype, factor, dtype not in shown, small, custom, hover)
            fig.add_trace(line, row=r + 1, col=c + 1)
            shown.add(dtype)
        hits = _regression_points(flagged[flagged["metric"] == metric], mf) if not flagged.empty else flagged
        if not hits.empty:
            fig.add_trace(
                _regression_trace(hits, factor, machine, size=16, showlegend="regression" not in shown),
                row=r + 1,
                col=c + 1,
            )
            shown.add("regression")
        for x, _, _ in boundaries(mf):
            vline(fig, x, {"color": "#888", "dash": "dot", "width": 1}, r + 1, c + 1)
        if 0 < len(ticks) <= MAX_LABELLED_TICKS:
            fig.update_xaxes(
                tickvals=list(ticks["when"]),
                ticktext=[f"vLLM {esc(v)}" for v in ticks["vllm_version"]],
                tickfont={"size": 10},
                row=r + 1,
                col=c + 1,
            )
        fig.update_yaxes(title_text=f"({esc(unit)})", title_font={"size": 11}, row=r + 1, col=c + 1)
    fig.update_annotations(font_size=12)
    style(fig, f"All tracked metrics at a glance — {machine}", height=140 + 250 * rows)
    return fig


def metric_order(history: pd.DataFrame, regressions: pd.DataFrame) -> list[str]:
    """Metrics with a regression first, then metrics.toml's order (capacity, latency, throughput, accuracy)."""
    present = list(pd.unique(history["metric"]))
    from kvbench.specs.tracked import metrics

    known = [m.name for m in metrics()]
    order = [m for m in known if m in present] + [m for m in present if m not in known]
    flagged = set(_flagged(regressions)["metric"]) if not regressions.empty else set()
    return [m for m in order if m in flagged] + [m for m in order if m not in flagged]


def build(data: SiteData) -> Page:
    page = Page(SLUG, TITLE)
    parts = page.heading(
        """Each tracked metric (kvbench/data/metrics.toml) over commits, per machine and KV dtype, from the asv results
        under the results folder. Dotted lines mark a new vLLM version; red rings mark what <code>kvbench
        regress</code> calls a regression. Hover a point for its run, date, vLLM version and machine."""
    )
    h = data.history
    if h.empty:
        why = f" ({esc(data.history_note)})" if data.history_note else ""
        parts.append(
            empty(
                f"No asv history under <code>{esc(data.results_dir)}</code>{why}. "
                "Each history point is one <code>kvbench run</code> "
                "recorded through the asv suite: "
                "run <code>kvbench history run</code> (add <code>--venv DIR</code> for another vLLM "
                "release), then rebuild with <code>kvbench dashboard</code>."
            )
        )
        return page.done(parts)
    flagged = _flagged(data.regressions)
    if not flagged.empty:
        parts.append(
            note(
                f"{len(flagged)} regression(s) flagged by <code>kvbench regress</code> (its default window and "
                "noise floors):",
                "warn",
            )
            + regressions_table(flagged)
        )
    else:
        parts.append(
            note(
                f"No regressions: <code>kvbench regress</code> (its default window and noise floors) finds none in the "
                f"newest point of {h.groupby(['machine', 'metric', 'kv_dtype']).ngroups} series.",
                "ok",
            )
        )
    order = metric_order(h, data.regressions)
    for machine in sorted(h["machine"].unique(), key=str):
        mh = h[h["machine"] == machine]
        parts.append(page.plot(glance_figure(mh, data.regressions, order), f"history-glance-{slug(machine)}"))
        gaps = mh[mh["value"].isna()]
        if not gaps.empty:  # failures stay visible: say which dtype has no numbers, where, and why
            lines = []
            for dtype, g in sorted(gaps.groupby("kv_dtype"), key=lambda kv: dtype_sort_key(kv[0])):
                states = ", ".join(
                    sorted({text(x) or "not measured" for x in g.get("state", pd.Series(["not measured"]))})
                )
                lines.append(
                    f"{dtype_chip(dtype)} no value for {g['metric'].nunique()} of {mh['metric'].nunique()} metrics at "
                    f"{g['run_id'].nunique()} of {mh['run_id'].nunique()} "
                    f"points ({esc(states)}); each metric below lists them."
                )
            parts.append(note(f"Not measured on {esc(machine)}:<br>" + "<br>".join(lines), "warn"))
    for metric in order:
        mf = h[h["metric"] == metric]
        label, unit = mf["label"].iloc[0], mf["unit"].iloc[0]
        direction = mf["direction"].iloc[0]
        missing = mf[mf["value"].isna()]
        plotted = mf.dropna(subset=["value"])
        inner = f'<p class="lead">{esc(direction)} is better.</p>'
        if plotted.empty:
            inner += empty(f"No values recorded for {esc(label)} yet.")
        else:
            inner += page.plot(
                metric_figure(
                    plotted,
                    data.regressions[data.regressions["metric"] == metric]
                    if not data.regressions.empty
                    else data.regressions,
                    label,
                    unit,
                ),
                f"history-{slug(metric)}",
            )
        if not missing.empty:
            # One line per series that has gaps: which dtype, how often, under which vLLM versions, and why.
            state = missing["state"] if "state" in missing else pd.Series("not measured", index=missing.index)
            gaps = (
                missing.assign(state=state.fillna("not measured"))
                .groupby(["machine", "kv_dtype", "state"], sort=True)
                .agg(
                    points=("value", "size"),
                    versions=("vllm_version", lambda v: ", ".join(sorted({str(x) for x in v}))),
                    runs=(
                        "run_id",
                        lambda v: (
                            ", ".join(str(x) for x in list(dict.fromkeys(v))[:3]) + (" …" if len(set(v)) > 3 else "")
                        ),
                    ),
                )
                .reset_index()
            )
            totals = mf.groupby(["machine", "kv_dtype"]).size()
            gaps["of"] = [
                f"{p} of {totals[(m, d)]}"
                for p, m, d in zip(gaps["points"], gaps["machine"], gaps["kv_dtype"], strict=False)
            ]
            gaps["dtype_html"] = [dtype_chip(d) for d in gaps["kv_dtype"]]
            inner += note(
                "Not measured at these points (the dtype failed or was skipped; its run record says why):", "warn"
            )
            inner += table(
                gaps,
                {
                    "machine": "machine",
                    "dtype_html": "KV dtype",
                    "state": "state",
                    "of": "points",
                    "versions": "vLLM",
                    "runs": "runs",
                },
                raw={"dtype_html"},
            )
        parts.append(section(label, inner, anchor=slug(metric)))
    return page.done(parts)
