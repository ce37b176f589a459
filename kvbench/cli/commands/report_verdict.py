"""`kvbench report`'s verdict: task accuracy per condition, the recommendation, and the throughput vs
interactivity fronts with their cost and energy."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from kvbench.analysis.verdict_speed import cost_lines
from kvbench.core.output import console, num
from kvbench.records import conditions, fixed_phase


def render_quality(doc: dict, decision) -> None:
    """Task accuracy per dtype and condition (Wilson 95% CI) with its verdict against auto, then the
    recommendation: one line per dtype, each reason once (kvbench.analysis.verdict, the one place it is decided)."""
    rows = [
        (d["kv_cache_dtype"], cond, summary, task, e)
        for d in doc.get("dtypes", [])
        for cond, summary in conditions(d.get("eval"))
        for task, e in (summary.get("tasks") or {}).items()
    ]
    if rows:
        table = Table(
            title="Task accuracy through lm-evaluation-harness (temperature 0; Wilson 95% CI; vs auto on the same "
            "items: non-inferiority against the budget)",
            title_justify="left",
        )
        for col in ("KV dtype", "task", "condition", "accuracy", "95% CI", "items", "vs auto", "vs itself at rest"):
            table.add_column(col, justify="right" if col in ("accuracy", "95% CI", "items") else "left")
        for dtype, cond, summary, task, e in rows:
            ci = e.get("ci95")
            acc = decision.dtypes[dtype].accuracy if dtype in decision.dtypes else None
            table.add_row(
                dtype,
                task,
                _condition(cond, summary),
                f"{e['accuracy'] * 100:.1f}%" if e.get("accuracy") is not None else "—",
                f"{ci[0] * 100:.1f}..{ci[1] * 100:.1f}%" if ci else "—",
                str(e.get("n")),
                _test_cell(acc.tests if acc else (), task, cond),
                _test_cell(acc.under_load if acc else (), task, cond),
            )
        console.print(table, markup=False)
    for d in doc.get("dtypes", []):
        if (d.get("eval") or {}).get("error"):
            console.print(f"[red]{d['kv_cache_dtype']}: evaluation failed[/] — {d['eval']['error']}")
    canaries = [
        (
            d["kv_cache_dtype"],
            sum((p.get("canaries") or {}).get("sent", 0) for p in d.get("phases", [])),
            sum((p.get("canaries") or {}).get("differ", 0) for p in d.get("phases", [])),
        )
        for d in doc.get("dtypes", [])
    ]
    canaries = [c for c in canaries if c[1]]
    if canaries:
        console.print(
            "canaries (at-rest greedy outputs re-sent inside every load phase): "
            + ", ".join(f"{k} {differ} of {sent} differed" for k, sent, differ in canaries)
        )
    render_decision(decision)


def render_verdict_table(record, decision, explain: bool) -> None:
    """The verdict, one row per dtype (kvbench.analysis.verdict_table: the same table the Overview leads with), then the
    headline; the full statement (every test, each condition) only with --explain."""
    from kvbench.analysis.verdict_table import COLUMNS, rows

    p = decision.policy
    table = Table(
        title=f"Verdict (accuracy budget {p.budget:g} point{'' if p.budget == 1 else 's'}, one-sided "
        f"{p.confidence:.0%}; fidelity: mean KLD nats/token and top-token agreement vs auto at rest, "
        "per condition, 95% CI)",
        title_justify="left",
    )
    for col in COLUMNS:
        table.add_column(col, overflow="fold")
    for r in rows(record, decision):
        table.add_row(*r.cells())
    console.print(table, markup=False, highlight=False)
    if not explain:  # with --explain the headline leads the long statement (render_decision), printed once
        style = "bold" if decision.recommended else "bold red"
        console.print(f"[{style}]{escape(decision.headline())}[/]")
        console.print("kvbench report --explain RUN.json: every test behind each verdict, per task and condition")


def render_decision(decision) -> None:
    """The recommendation, then one line per dtype."""
    p = decision.policy
    console.print(
        f"[bold]{escape(decision.headline())}[/]"
        if decision.recommended
        else f"[bold red]{escape(decision.headline())}[/]"
    )
    for line in decision.lines():
        console.print("  " + line, markup=False, highlight=False)
    console.print(
        f"how: accuracy must be non-inferior to auto within {p.budget:g} point{'' if p.budget == 1 else 's'}"
        + (f" ({', '.join(f'{k} {v:g}' for k, v in p.budgets.items())})" if p.budgets else "")
        + f" at one-sided {p.confidence:.0%} confidence; {decision.method}",
        markup=False,
        highlight=False,
    )


def _condition(cond: str, summary: dict) -> str:
    c = summary.get("concurrency")
    return {
        "rest": "at rest (1 at a time)",
        "load": f"at load ({c} in flight)",
        "during_load": "during load (1 at a time beside the fixed load)",
    }.get(cond, cond)


def _test_cell(tests, task: str, cond: str) -> str:
    """The verdict on one condition: its drop, the one-sided bound and the test's verdict."""
    for t in tests:
        if t.task == task and cond in t.conditions:
            r = t.result
            bound = -r.upper if r.verdict == "inferior" else -r.lower
            return f"{r.verdict}: drop {t.drop + 0.0:+.1f}, bound {bound * 100:.1f} vs budget {t.budget:g}"
    return "—"


def render_fronts(doc: dict, record) -> None:
    """The trade-off curve per dtype (points, the Pareto front, cost) and what it says against auto."""
    fronts = [(d["kv_cache_dtype"], d["front"]) for d in doc.get("dtypes", []) if d.get("front")]
    if not fronts:
        return
    emulated = {d["kv_cache_dtype"] for d in doc.get("dtypes", []) if d.get("emulated")}
    per = "GPU" if (doc.get("environment") or {}).get("gpus") else "device"
    console.print(_fronts_table(fronts, emulated, per))
    for dtype, f in fronts:
        _render_front_line(dtype, f, per, dtype in emulated)
    for c in doc.get("comparisons") or []:
        if c["kv_cache_dtype"] in emulated:
            console.print(f"{c['kv_cache_dtype']}: no cost or throughput comparison with auto (its speed is emulated)")
    for line in cost_lines(record):  # each with the interval its throughput's uncertainty allows
        console.print(line, markup=False, highlight=False)
    _render_energy(doc)


def _fronts_table(fronts: list, emulated: set, per: str) -> Table:
    priced = any(f.get("price_per_gpu_hour") is not None for _, f in fronts)
    gpus = fronts[0][1].get("gpus", 1)
    table = Table(
        title=f"Throughput vs interactivity (* on the Pareto front; per {per}, {gpus} per server)", title_justify="left"
    )
    cols = [
        "KV dtype",
        "concurrency",
        f"output tok/s per {per}",
        "tok/s per user (1000/TPOT P50)",
        "tok/s per user (E2E)",
        "TTFT P95 (ms)",
        "TPOT P95 (ms)",
        "SLO",
    ] + (["USD / M output tok"] if priced else [])
    for col in cols:
        table.add_column(col, justify="left" if col == "KV dtype" else "right")
    for dtype, f in fronts:
        for p in f.get("points") or []:
            met = {True: "met", False: "missed", None: "—"}[p.get("meets_slo")]
            row = [
                dtype,
                f"{p['concurrency']}{'*' if p.get('on_front') and dtype not in emulated else ''}",
                num(p.get("output_tps_per_gpu"), 0),
                num(p.get("user_tps"), 1),
                num(p.get("user_tps_e2e"), 1),
                num(p.get("ttft_p95_ms"), 1),
                num(p.get("tpot_p95_ms"), 2),
                met,
            ]
            if priced:
                row.append(num(p.get("usd_per_m_output"), 3))
            if dtype in emulated:  # the emulation's speed: kept, never a front to choose from
                row = [f"[dim]{x}[/]" for x in [f"{dtype} (emulated)", *row[1:]]]
            table.add_row(*row)
    return table


def _render_front_line(dtype: str, f: dict, per: str, emulated: bool) -> None:
    """What one dtype's front says: its best point under the SLO and its throughput at the target interactivity."""
    best, target = f.get("at_slo"), f.get("at_target")
    parts = []
    if best:
        cost = (
            f", USD {best['usd_per_m_output']:.3f} per million output tokens"
            if best.get("usd_per_m_output") is not None
            else ""
        )
        parts.append(
            f"under the SLO best at concurrency {best['concurrency']}: "
            f"{best['output_tps_per_gpu']:,.0f} tok/s per {per}{cost}"
        )
    if target:
        cost = f", USD {target['usd_per_m_output']:.3f}/M" if target.get("usd_per_m_output") is not None else ""
        parts.append(
            f"at {target['user_tps']:.1f} tok/s per user (front, PCHIP): "
            f"{target['output_tps_per_gpu']:,.0f} tok/s per {per}{cost}"
        )
    elif f.get("target_user_tps"):
        parts.append(f"its front does not reach {f['target_user_tps']:.1f} tok/s per user")
    if parts:
        note = " (emulated: not representative)" if emulated else ""
        console.print(f"{dtype}{note}: " + "; ".join(parts))


def _render_energy(doc: dict) -> None:
    energy = [(d["kv_cache_dtype"], (fixed_phase(d) or {}).get("energy")) for d in doc.get("dtypes", [])]
    energy = [(k, e) for k, e in energy if e]
    if energy and all(not e.get("valid") for _, e in energy):
        console.print(f"energy: not measured ({energy[0][1].get('reason')})")
    for dtype, e in energy:
        if e.get("valid"):
            console.print(
                f"energy {dtype} ({e['source']}): {e['avg_watts']:.0f} W average, "
                f"{num(e.get('j_per_output_token'), 3)} J per output token, "
                f"{num(e.get('j_per_total_token'), 4)} J per token"
            )
