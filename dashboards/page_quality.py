"""Quality under load: task accuracy per KV dtype with 95% intervals, at rest vs at load vs during the fixed
load, the paired verdict against auto, the canaries, and a few items a dtype got wrong that auto got right.
From the eval phase of `kvbench run` (harness/quality/underload.py); newest run per machine and model."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from kvbench.dashboards.components import Page, empty, hover_data, hover_template, note, section, slug, table
from kvbench.dashboards.data import SiteData, differing_items
from kvbench.dashboards.fidelity_view import fidelity_section
from kvbench.dashboards.theme import color, esc, ordered, style, symbol
from kvbench.records import CONDITIONS

SLUG, TITLE = "quality", "Quality"


def accuracy_figure(rows: pd.DataFrame, title: str) -> go.Figure:
    """Accuracy (%) per condition, one marker per dtype and machine, with its Wilson 95% interval."""
    fig = go.Figure()
    machines = sorted(rows["machine"].unique(), key=str)
    for machine in machines:
        for dtype in ordered(rows["kv_cache_dtype"]):
            pts = rows[(rows["machine"] == machine) & (rows["kv_cache_dtype"] == dtype)]
            if pts.empty:
                continue
            pts = pts.assign(order=pts["condition"].map(list(CONDITIONS).index)).sort_values("order")
            y = pts["accuracy"] * 100
            fig.add_trace(
                go.Scatter(
                    x=[CONDITIONS.get(c, c) for c in pts["condition"]],
                    y=y,
                    mode="markers+lines",
                    name=esc(f"{dtype} · {machine}") if len(machines) > 1 else esc(dtype),
                    marker={"color": color(dtype), "symbol": symbol(dtype), "size": 10},
                    line={"color": color(dtype), "width": 1},
                    error_y={
                        "type": "data",
                        "symmetric": False,
                        "array": (pts["ci_high"] * 100 - y).fillna(0).tolist(),
                        "arrayminus": (y - pts["ci_low"] * 100).fillna(0).tolist(),
                        "color": color(dtype),
                    },
                    customdata=hover_data(pts, extra=["kv_cache_dtype", "n", "vs_auto"]),
                    hovertemplate=hover_template(
                        [
                            "<b>%{customdata[4]}</b> %{x}: %{y:.1f}% of %{customdata[5]} items",
                            "vs auto: %{customdata[6]}",
                        ]
                    ),
                )
            )
    fig.update_xaxes(title_text="condition (at rest: 1 request at a time; at load: the serving concurrency)")
    fig.update_yaxes(title_text="task accuracy, Wilson 95% CI (%)")
    return style(fig, title, height=420)


def build(data: SiteData) -> Page:
    page = Page(SLUG, TITLE)
    parts = page.heading(
        """Task accuracy per KV dtype through lm-evaluation-harness (temperature 0), measured one request at a time, at
        the run's serving concurrency and while its fixed load runs; every item is compared with auto's answer to the
        same item. The verdict is non-inferiority: a dtype is eligible only when the one-sided bound on its drop
        against auto (Tango's score test; all tasks' items pooled as the primary endpoint, each test at the full level,
        "inferior" Holm-adjusted) stays inside the budget; <i>undecided</i>
        (too few items to tell) and <i>inferior</i> are not; the Overview's line per dtype gives the bound, the
        budget and the items that would decide it (docs/verdict.md). The <i>vs auto</i> column here is the two-sided
        McNemar description of the same pairs. Canaries (greedy outputs recorded at rest) ride inside every load
        phase."""
    )
    if data.quality.empty:
        parts.append(
            empty(
                f"No run under <code>{esc(data.results_dir)}</code> has an evaluation — <code>kvbench run</code> "
                "evaluates on the CPU default (its three bundled "
                "tasks); on a GPU pass <code>--eval-tasks gsm8k</code>."
            )
        )
        return page.done(parts)
    # each machine and model's newest run; transform keeps the sorted frame's order, so align it back first
    latest = data.quality.sort_values("created_at").groupby(["machine", "model"])["run_id"].transform("last")
    rows = data.quality[data.quality["run_id"] == latest.reindex(data.quality.index)]
    for (model, task), group in rows.groupby(["model", "task"], sort=True):
        title = f"{model}: {task}"
        inner = page.plot(accuracy_figure(group, f"Accuracy per KV dtype — {title}"), f"quality-{slug(title)}")
        view = group.assign(order=group["condition"].map(lambda c: list(CONDITIONS).index(c) if c in CONDITIONS else 9))
        view = view.sort_values(["machine", "kv_cache_dtype", "order"])
        view["accuracy_t"] = [f"{a * 100:.1f}%" if pd.notna(a) else "—" for a in view["accuracy"]]
        view["ci"] = [
            f"{lo * 100:.1f}..{hi * 100:.1f}%" if pd.notna(lo) and pd.notna(hi) else "—"
            for lo, hi in zip(view["ci_low"], view["ci_high"], strict=False)
        ]
        view["cond"] = [CONDITIONS.get(c, c) for c in view["condition"]]
        inner += table(
            view,
            {
                "machine": "machine",
                "kv_cache_dtype": "KV dtype",
                "cond": "condition",
                "concurrency": "in flight",
                "accuracy_t": "accuracy",
                "ci": "95% CI",
                "n": "items",
                "vs_auto": "vs auto (paired, McNemar)",
                "vs_rest": "vs itself at rest",
            },
            numeric={"concurrency", "accuracy_t", "n"},
        )
        for (machine, dtype, cond), g in sorted(
            group.groupby(["machine", "kv_cache_dtype", "condition"]),
            key=lambda kv: (kv[0][0], kv[0][1], list(CONDITIONS).index(kv[0][2]) if kv[0][2] in CONDITIONS else 9),
        ):
            if dtype == "auto":
                continue
            diff = differing_items(g["path"].iloc[0], dtype, task, cond)
            if diff.attrs.get("problem"):
                inner += note(esc(diff.attrs["problem"]))
            if diff.empty:
                continue
            diff["response_auto"] = diff["response_auto"].astype(str)
            inner += (
                f"<h3>{esc(dtype)} on {esc(machine)}, {esc(CONDITIONS.get(cond, cond))}: "
                "items auto got right and it got wrong</h3>"
            )
            inner += table(
                diff,
                {
                    "doc_id": "item",
                    "target_auto": "expected",
                    "response_auto": "auto answered",
                    "response_dtype": f"{dtype} answered",
                    "prompt_sha256_auto": "prompt (sha256)",
                },
            )
        parts.append(section(title, inner))
    forest = _forest_section(page, data)
    if forest:
        parts.insert(2 if len(parts) > 2 else len(parts), forest)  # the verdict's picture leads the page
    fidelity = fidelity_section(page, data)  # dashboards/fidelity_view.py
    if fidelity:
        parts.append(fidelity)
    if not data.canaries.empty:
        c = data.canaries.sort_values("created_at").groupby(["machine", "kv_cache_dtype"]).tail(1)
        parts.append(
            section(
                "Canaries under load",
                table(
                    c,
                    {
                        "machine": "machine",
                        "kv_cache_dtype": "KV dtype",
                        "phases": "load phases",
                        "sent": "sent",
                        "differ": "came back different",
                    },
                    numeric={"phases", "sent", "differ"},
                )
                + note(
                    "A canary is a prompt whose greedy output was recorded at rest on the same server; one that comes "
                    "back different under load means the dtype's outputs change with batching."
                ),
            )
        )
    return page.done(parts)


def _forest_section(page: Page, data: SiteData) -> str | None:
    """Per machine and model's newest run: every paired comparison's drop and one-sided bounds against the budget
    (dashboards/verdict_view.py), coloured by verdict."""
    from kvbench.analysis.verdict import decide
    from kvbench.dashboards.verdict_view import forest_figure
    from kvbench.records import read_record

    newest = data.quality.sort_values("created_at").groupby(["machine", "model"]).tail(1)
    inner = ""
    for _, r in newest.iterrows():
        try:
            decision = decide(read_record(r["path"]))
        except Exception as exc:  # a damaged record costs its own plot, not the page
            inner += note(esc(f"{r['machine']}: no forest plot ({exc})"))
            continue
        title = f"Accuracy drop vs auto and its one-sided bounds — {r['machine']}, {r['model']}"
        fig = forest_figure(decision, title, hover_data(newest.loc[[r.name]])[0])
        if fig is not None:
            inner += page.plot(fig, f"quality-forest-{slug(str(r['machine']) + '-' + str(r['model']))}")
    if not inner:
        return None
    return section("Verdict: every comparison against the budget", inner)
