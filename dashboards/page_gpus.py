"""Across GPUs: the same model and workload on every machine side by side, newest run per machine."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvbench.dashboards.components import Page, empty, fmt, hover_data, hover_template, note, section, slug, table, text
from kvbench.dashboards.data import SiteData
from kvbench.dashboards.theme import color, esc, ordered, pattern, style

SLUG, TITLE = "gpus", "Across GPUs"
PANELS = (  # column, panel title, axis title, unit
    ("measured_max_concurrency", "Max concurrency under the SLO", "concurrency", "requests"),
    ("engine_max_concurrency", "Max concurrency, engine-reported", "concurrency", "requests"),
    ("output_throughput_tps", "Output throughput", "throughput", "tokens/s"),
    ("ttft_p95_ms", "TTFT P95", "TTFT P95", "ms"),
    ("tpot_p95_ms", "TPOT P95", "TPOT P95", "ms"),
    ("goodput_rps", "Goodput under the SLO", "goodput", "requests/s"),
)
WORKLOAD = ["model", "workload", "context", "fixed_load"]


def workload_groups(runs: pd.DataFrame) -> list[tuple[tuple, pd.DataFrame]]:
    """Rows grouped by model and workload, each keeping the newest run per machine."""
    keyed = runs.assign(**{c: runs[c].astype(str) for c in WORKLOAD})
    out = []
    for key, g in keyed.groupby(WORKLOAD, sort=True):
        newest = g.sort_values("created_at").groupby("machine")["run_id"].last()
        out.append((key, runs.loc[g.index][runs.loc[g.index, "run_id"].isin(newest.values)]))
    return sorted(out, key=lambda kg: -kg[1]["machine"].nunique())


def comparison_figure(rows: pd.DataFrame) -> go.Figure:
    machines = sorted(rows["machine"].unique(), key=str)
    labels = {m: esc(m) for m in machines}
    fig = make_subplots(
        rows=2,
        cols=3,
        subplot_titles=[f"{t} ({u})" for _, t, _, u in PANELS],
        vertical_spacing=0.2,
        horizontal_spacing=0.07,
    )
    for i, (col, _title, axis, unit) in enumerate(PANELS):
        r, c = divmod(i, 3)
        for dtype in ordered(rows["kv_cache_dtype"]):
            pts = rows[rows["kv_cache_dtype"] == dtype].sort_values("machine")
            missing = pts[col].isna()
            # A dtype that ran but has no number (it failed) gets an empty slot labelled with its status.
            value = [
                f"not measured ({text(s)})" if m else f"{v:.4g} {unit}"
                for v, m, s in zip(pts[col], missing, pts["status"], strict=False)
            ]
            lo, hi = f"{col}_ci_low", f"{col}_ci_high"
            error = None
            if lo in pts and pts[lo].notna().any():  # repeated fixed loads: the 95% interval of the mean
                error = {
                    "type": "data",
                    "symmetric": False,
                    "array": (pts[hi] - pts[col]).fillna(0).tolist(),
                    "arrayminus": (pts[col] - pts[lo]).fillna(0).tolist(),
                    "color": "#333",
                    "thickness": 1.2,
                }
            fig.add_trace(
                go.Bar(
                    x=[labels[m] for m in pts["machine"]],
                    y=pts[col].fillna(0),
                    name=esc(dtype),
                    legendgroup=dtype,
                    showlegend=i == 0,
                    error_y=error,
                    marker={
                        "color": color(dtype),
                        "line": {"color": "#333", "width": 0.5},
                        "pattern": {"shape": pattern(dtype), "fgcolor": "#fff"},
                    },
                    text=[f"✕ {esc(text(s))}" if m else "" for m, s in zip(missing, pts["status"], strict=False)],
                    textposition="outside",
                    textfont={"color": "#D55E00", "size": 11},
                    cliponaxis=False,
                    customdata=[
                        row + [esc(v)]
                        for row, v in zip(
                            hover_data(pts, extra=["kv_cache_dtype", "gpu", "status"]), value, strict=False
                        )
                    ],
                    hovertemplate=hover_template(
                        ["<b>%{customdata[4]}</b>: %{customdata[7]}", "%{customdata[5]}", "status %{customdata[6]}"]
                    ),
                ),
                row=r + 1,
                col=c + 1,
            )
        fig.update_yaxes(title_text=f"{axis} ({esc(unit)})", row=r + 1, col=c + 1)
        fig.update_xaxes(title_text="machine", row=r + 1, col=c + 1)
    style(fig, None, height=640)
    fig.update_layout(barmode="group")
    return fig


def build(data: SiteData) -> Page:
    page = Page(SLUG, TITLE)
    parts = page.heading(
        """The same model and workload on every machine (A100 vs H100 vs H200 …), newest run per machine, per KV dtype.
        Runs are compared only with runs of the same model, prompt/output lengths, context and fixed load. <b>✕
        partial</b> / <b>✕ failed</b> in a bar's place: the dtype ran but its engine failed before that number was
        measured."""
    )
    if data.runs.empty:
        parts.append(
            empty(
                f"No run records under <code>{esc(data.results_dir)}</code> — run <code>kvbench run</code> on each "
                "machine and copy its <code>results/&lt;machine&gt;/</code> folder here to compare them."
            )
        )
        return page.done(parts)
    for (model, workload, context, load), rows in workload_groups(data.runs):
        title = f"{model}: {workload}, context {context}, fixed load {load}"
        inner = ""
        n = rows["machine"].nunique()
        if n == 1:
            inner += note(
                f"Only <b>{esc(rows['machine'].iloc[0])}</b> has results for this model and workload. Run the same "
                "<code>kvbench run</code> on another GPU and copy its <code>results/&lt;machine&gt;/</code> folder in "
                "to compare machines."
            )
        inner += page.plot(comparison_figure(rows), f"gpus-{slug(title)}")
        machines = rows.drop_duplicates("machine").sort_values("machine").copy()
        machines["vllm"] = machines["vllm_package"].astype(str) + " " + machines["vllm_version"].astype(str)
        machines["when"] = [
            fmt(None) if pd.isna(t) else t.strftime("%Y-%m-%d %H:%M UTC") for t in machines["created_at"]
        ]
        failed = (
            rows[rows["status"] != "ok"].groupby("machine")["kv_cache_dtype"].apply(lambda s: ", ".join(ordered(s)))
        )
        machines["failed"] = [failed.get(m, "—") for m in machines["machine"]]
        inner += table(
            machines,
            {
                "machine": "machine",
                "gpu": "GPU",
                "vllm": "vLLM",
                "driver": "driver",
                "cuda": "CUDA",
                "run_id": "run",
                "when": "date",
                "failed": "dtypes failed",
            },
        )
        parts.append(section(title, inner))
    return page.done(parts)
