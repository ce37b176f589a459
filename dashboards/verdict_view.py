"""The verdict on the pages: the Overview's one table per run (kvbench.analysis.verdict_table, the rows `kvbench report`
prints) with the long statement in a collapsed section, and the Quality page's forest plot (each paired
comparison's drop and one-sided bound, per task x condition and pooled, against the budget)."""

from __future__ import annotations

import plotly.graph_objects as go

from kvbench.dashboards.theme import esc, style

STATE_COLORS = {"non-inferior": "#009E73", "inferior": "#D55E00", "undecided": "#E69F00"}


def table_html(record, decision) -> str:
    """One row per dtype: verdict, capacity and speed vs auto, accuracy drop and bound vs budget, fidelity,
    one short reason."""
    from kvbench.analysis.verdict_table import COLUMNS, rows

    head = "".join(f"<th>{esc(c)}</th>" for c in COLUMNS)
    body = ""
    for r in rows(record, decision):
        cells = [esc(c) for c in r.cells()]
        tint = STATE_COLORS.get(r.state)
        if tint:
            cells[1] = f'<span style="color:{tint};font-weight:600">{cells[1]}</span>'
        body += "<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"
    p = decision.policy
    caption = (
        f"accuracy budget {p.budget:g} point{'' if p.budget == 1 else 's'}, one-sided {p.confidence:.0%}; "
        "mean KLD (nats/token) and top-token agreement vs auto at rest, per condition, 95% CI"
    )
    return (
        f'<table class="data verdict-table"><caption>{esc(caption)}</caption><thead><tr>{head}</tr></thead>'
        f"<tbody>{body}</tbody></table>"
    )


def statement_html(lines: list[str], how: str) -> str:
    """The long statement, collapsed: one line per dtype, each reason once, and how it was decided."""
    if not lines:
        return ""
    items = "".join(f"<li>{esc(line)}</li>" for line in lines)
    return (
        '<details class="verdict-statement"><summary>The full statement: every test behind each verdict</summary>'
        f'<ul class="verdict-lines">{items}</ul><small>{how}</small></details>'
    )


def forest_figure(decision, title: str, facts: list[str] | None = None) -> go.Figure | None:
    """Each dtype's paired drop against auto with its one-sided bounds (at the level each test used), per task x
    condition and pooled; the budget as a vertical line; coloured by verdict. facts: the run's customdata (run id,
    date, vLLM, machine: components.hover_data) every point's hover ends with."""
    from kvbench.dashboards.components import hover_template

    facts = facts or ["—"] * 4
    fig = go.Figure()
    labels: list[str] = []
    for name, v in decision.dtypes.items():
        a = v.accuracy
        tests = ([a.primary] if a.primary is not None else []) + list(a.tests)
        for t in tests:
            r = t.result
            where = "pooled" if t.pooled else t.task
            label = f"{name} · {where} · {', '.join(t.conditions)}"
            labels.append(label)
            lo, hi = -r.upper * 100, -r.lower * 100  # drop: the smallest and largest the data allow
            fig.add_trace(
                go.Scatter(
                    x=[t.drop],
                    y=[label],
                    mode="markers",
                    marker={"color": STATE_COLORS.get(r.verdict, "#999"), "size": 11 if t.pooled else 8},
                    error_x={"type": "data", "symmetric": False, "array": [hi - t.drop], "arrayminus": [t.drop - lo]},
                    name=r.verdict,
                    legendgroup=r.verdict,
                    showlegend=r.verdict not in {tr.name for tr in fig.data},
                    customdata=[facts],
                    hovertemplate=hover_template(
                        [
                            esc(label),
                            f"drop %{{x:.2f}} points; bounds {lo:.2f}..{hi:.2f} "
                            f"(one-sided {100 * (1 - r.alpha_used):.4g}% each)",
                            f"{r.n:,} items: {r.losses} lost, {r.gains} gained; {r.verdict}",
                        ]
                    ),
                )
            )
    if not labels:
        return None
    budget = decision.policy.budget
    fig.add_vline(x=budget, line={"color": "#D55E00", "dash": "dash"}, annotation_text=f"budget {budget:g}")
    fig.add_vline(x=0, line={"color": "#999", "width": 1})
    style(fig, title, height=max(260, 60 + 26 * len(labels)))
    fig.update_xaxes(title="accuracy drop vs auto (points; right is worse)")
    fig.update_yaxes(autorange="reversed", type="category")
    return fig
