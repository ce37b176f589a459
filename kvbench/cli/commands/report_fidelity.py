"""`kvbench report`'s fidelity section: KL(auto || dtype) per token, teacher-forced (harness/quality/fidelity.py),
beside the floor (auto at load vs auto at rest)."""

from __future__ import annotations

from rich.table import Table

from kvbench.core.fidelity_stats import versus_floor
from kvbench.core.output import console

CONDITIONS = (
    "rest",
    "load",
    "torch",
)  # torch: a real model's auto vs transformers at bf16 (harness/quality/textfidelity.py)


def _ci(values) -> str:
    return f" [{values[0]:.1e}, {values[1]:.1e}]" if values else ""


def _pct_ci(values) -> str:
    return f" [{100 * values[0]:.1f}, {100 * values[1]:.1f}]" if values else ""


def floor_of(doc: dict) -> dict | None:
    """Auto's "load" entry: auto under load scored against auto at rest (batch variance alone)."""
    for d in doc.get("dtypes", []):
        if d.get("kv_cache_dtype") == "auto":
            return (d.get("fidelity") or {}).get("load")
    return None


def _row(name: str, cond: str, s: dict, floor: dict | None) -> list[str]:
    gold = s.get("mean_gold_dlogp")
    if cond == "torch":
        vs = "implementation floor"
    elif name == "auto":
        vs = "the floor"
    elif floor is None:
        vs = "no floor"
    else:
        vs = versus_floor(s, floor)
    return [
        name,
        "vs transformers" if cond == "torch" else f"{cond} (c{s.get('concurrency', '?')})",
        f"{s['mean_kld']:.1e}{_ci(s.get('mean_kld_ci'))}" if s.get("mean_kld") is not None else "-",
        f"{s['p99_kld']:.1e}" if s.get("p99_kld") is not None else "-",
        f"{100 * s['top1_agreement']:.1f}%{_pct_ci(s.get('top1_agreement_ci'))}"
        if s.get("top1_agreement") is not None
        else "-",
        f"{gold:+.3f}" if gold is not None else "-",
        f"{s.get('items', 0)} / {s.get('tokens', 0)}",
        f"{s['s_per_item']:.2f}" if s.get("s_per_item") is not None else "-",
        vs,
    ]


def render_fidelity(doc: dict) -> None:
    """One row per dtype and condition; nothing when the record has no fidelity (older runs, no eval tasks)."""
    rows = [
        (d["kv_cache_dtype"], c, (d.get("fidelity") or {}).get(c))
        for d in doc.get("dtypes", [])
        for c in CONDITIONS
        if (d.get("fidelity") or {}).get(c)
    ]
    if not rows:
        return
    floor = floor_of(doc)
    scored = rows[0][2].get("positions") or "auto's greedy answers"  # a real model: natural text
    t = Table(title=f"Fidelity per token: KL(auto at rest || dtype), teacher-forced over {scored}")
    for col in ("dtype", "condition", "mean KLD, nats [95% CI]", "P99 KLD", "top-1 agree [95% CI]",
                "Δ log p gold", "items / tokens", "s / item", "vs floor"):  # fmt: skip
        t.add_column(col, justify="left" if col in ("dtype", "condition", "vs floor") else "right")
    for name, cond, s in rows:
        t.add_row(*_row(name, cond, s, floor))
    console.print(t)
    method = rows[0][2].get("method", "")
    console.print(
        f"KLD from {method}; CIs: bootstrap over items (tokens clustered by item). The floor is auto at load vs "
        "auto at rest. KLD detects change, not harm: task accuracy alone decides; fidelity says whether a dtype "
        'can be told from the floor at all ("no measurable change": both its intervals reach the floor\'s).'
    )
