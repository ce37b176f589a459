"""The quality page's fidelity section: mean KLD per KV dtype and condition with its 95% CI, against the floor
(auto at load vs auto at rest), from each machine's newest run that measured it (harness/quality/fidelity.py)."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from kvbench.core.fidelity_stats import versus_floor
from kvbench.dashboards.components import Page, note, section, table
from kvbench.dashboards.data import SiteData
from kvbench.dashboards.models_view import newest_per_machine_and_model, titled
from kvbench.dashboards.theme import color, esc, ordered, style, symbol

# "torch": a real model's auto server against transformers at bf16 on the same tokens (harness/quality/textfidelity.py)
CONDITIONS = {"rest": "at rest", "load": "at load", "torch": "vs transformers"}


def fidelity_rows(records: list[dict]) -> pd.DataFrame:
    """One row per (machine, model, dtype, condition) of each machine's newest record with fidelity per model."""
    rows = []
    with_fid = [r for r in records if any(d.get("fidelity") for d in r.get("dtypes") or [])]
    for doc in newest_per_machine_and_model(with_fid):
        dtypes = doc.get("dtypes") or []
        floor = next(((d.get("fidelity") or {}).get("load") for d in dtypes if d["kv_cache_dtype"] == "auto"), None)
        for d in dtypes:
            for cond, s in (d.get("fidelity") or {}).items():
                if cond not in CONDITIONS or not isinstance(s, dict) or s.get("mean_kld") is None:
                    continue
                name = d["kv_cache_dtype"]
                lo, hi = s.get("mean_kld_ci") or (None, None)
                alo, ahi = s.get("top1_agreement_ci") or (None, None)
                vs = _vs_floor(name, cond, s, floor)
                rows.append(
                    {
                        "machine": doc.get("machine"),
                        "model": titled(doc),
                        "run_id": doc.get("run_id"),
                        "kv_cache_dtype": name,
                        "condition": cond,
                        "cond": f"{CONDITIONS[cond]} (c{s.get('concurrency', '?')})",
                        "mean_kld": s["mean_kld"],
                        "ci_low": lo,
                        "ci_high": hi,
                        "kld_t": f"{s['mean_kld']:.2e} [{lo:.1e}, {hi:.1e}]" if lo is not None else "—",
                        "p99_t": f"{s['p99_kld']:.2e}" if s.get("p99_kld") is not None else "—",
                        "agree_t": f"{100 * s['top1_agreement']:.1f}% [{100 * alo:.1f}, {100 * ahi:.1f}]"
                        if alo is not None
                        else "—",
                        "n": f"{s.get('items')} / {s.get('tokens')}",
                        "vs_floor": vs,
                        "floor": (floor or {}).get("mean_kld"),
                        "method": s.get("method"),
                    }
                )
    return pd.DataFrame(rows)


def _vs_floor(dtype: str, cond: str, summary: dict, floor: dict | None) -> str:
    if cond == "torch":
        return "implementation floor"
    if dtype == "auto":
        return "the floor"
    if floor is None:
        return "—"
    return versus_floor(summary, floor)


def figure(rows: pd.DataFrame, title: str) -> go.Figure:
    fig = go.Figure()
    for dtype in ordered(rows["kv_cache_dtype"]):
        pts = rows[rows["kv_cache_dtype"] == dtype]
        fig.add_trace(
            go.Scatter(
                x=pts["cond"].tolist(),
                y=pts["mean_kld"].tolist(),
                mode="markers",
                name=esc(dtype),
                marker={"color": color(dtype), "symbol": symbol(dtype), "size": 10},
                error_y={
                    "type": "data",
                    "symmetric": False,
                    "array": (pts["ci_high"] - pts["mean_kld"]).fillna(0).tolist(),
                    "arrayminus": (pts["mean_kld"] - pts["ci_low"]).fillna(0).tolist(),
                    "color": color(dtype),
                },
            )
        )
    floor = rows[rows["condition"] != "torch"]["floor"].dropna()
    if not floor.empty:
        fig.add_hline(y=float(floor.iloc[0]), line_dash="dash", annotation_text="floor: auto at load vs at rest")
    fig.update_yaxes(title_text="mean KL(auto ‖ dtype) per token, nats (95% CI)")
    return style(fig, title, height=380)


def fidelity_section(page: Page, data: SiteData) -> str | None:
    """The section's HTML, or None when no run has fidelity."""
    rows = fidelity_rows(data.records)
    if rows.empty:
        return None
    inner = ""
    for i, ((machine, model), group) in enumerate(rows.groupby(["machine", "model"], sort=True)):
        inner += page.plot(figure(group, f"Fidelity per token — {machine} — {model}"), f"fidelity-{machine}-{i}")
        inner += table(
            group,
            {
                "machine": "machine",
                "model": "model",
                "kv_cache_dtype": "KV dtype",
                "cond": "condition",
                "kld_t": "mean KLD, nats [95% CI]",
                "p99_t": "P99 KLD",
                "agree_t": "top-1 agreement [95% CI]",
                "n": "items / tokens",
                "vs_floor": "vs floor",
            },
            numeric={"kld_t", "p99_t", "agree_t", "n"},
        )
    inner += note(
        "Each dtype's server scores a text teacher-forced (vLLM's prompt_logprobs): auto's greedy answers to "
        "kvbench's tasks for the synthetic model, CPython's documentation for a real one; KL from "
        f"{esc(str(rows['method'].iloc[0]))}; CIs by bootstrap over items. The floor is auto at load scored against "
        "auto at rest (batch variance alone). KLD detects change, not harm: task accuracy decides."
    )
    return section("Fidelity per token (KL vs auto)", inner, anchor="fidelity")
