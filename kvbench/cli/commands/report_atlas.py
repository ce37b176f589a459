"""`kvbench report`'s atlas (kvbench/analysis/verdict_atlas.py) and where each dtype's KV scales came from."""

from __future__ import annotations

from rich.table import Table

from kvbench.analysis.verdict_atlas import is_atlas, rows
from kvbench.core.output import console
from kvbench.records import RunRecord


def _num(x, fmt: str) -> str:
    return "—" if x is None else fmt.format(x)


def render_atlas(record: RunRecord, decision) -> None:
    """The atlas table, for a run beyond the tracked dtypes (`--kv-dtypes all`, --kv-scales variants)."""
    if not is_atlas(record):
        return
    t = Table(title="Atlas: every KV dtype of the run, the most KV tokens first", title_justify="left")
    for col in ("dtype", "served", "KV tokens", "vs auto", "model = engine", "verdict", "mean KLD at rest [95% CI]",
                "top-1 agree", "scales", "why"):  # fmt: skip
        t.add_column(col, justify="right" if col in ("KV tokens", "vs auto", "top-1 agree") else "left")
    for r in rows(record, decision):
        kld = _num(r.kld, "{:.2e}") + (f" [{r.kld_ci[0]:.1e}, {r.kld_ci[1]:.1e}]" if r.kld_ci else "")
        match = {True: "yes", False: f"no (model {r.model_tokens:,})" if r.model_tokens else "no", None: "—"}
        t.add_row(
            r.dtype,
            r.served,
            _num(r.engine_tokens, "{:,}"),
            _num(r.gain, "{:.2f}x"),
            match[r.model_matches],
            r.verdict if r.served not in ("refused", "failed") else "—",
            kld,
            _num(r.top1, "{:.1%}"),
            r.scales or "—",
            r.reason,
        )
    console.print(t)
    console.print(
        f"recommended over all of them: {decision.recommended or 'none'} ({decision.why}). "
        "emulated: stored in vLLM's page layout by kvbench's CPU backend (capacity and accuracy count, speed does "
        "not); refused: vLLM's own reason, nothing started. KLD: fidelity per token against auto at rest."
    )


def render_scales(doc: dict) -> None:
    """Per quantized dtype: its scales' variant and source, the checkpoint's k/v scale range, vLLM's own lines."""
    rows_ = [(d["kv_cache_dtype"], d.get("scales")) for d in doc.get("dtypes", [])]
    rows_ = [(name, s) for name, s in rows_ if s and s.get("source") not in (None, "none")]
    if not rows_:
        return
    t = Table(title="KV scales: where each dtype's came from", title_justify="left")
    for col in ("dtype", "variant", "source", "k_scale", "v_scale", "why"):
        t.add_column(col)
    for name, s in rows_:
        ck = s.get("checkpoint") or {}
        sides = []
        for side in ("k_scale", "v_scale"):
            v = ck.get(side) or {}
            lo, hi = v.get("min"), v.get("max")
            sides.append("—" if lo is None else (f"{lo:.3g}" if lo == hi else f"{lo:.3g}..{hi:.3g}"))
        t.add_row(name, s.get("variant") or "checkpoint", s.get("source") or "—", *sides, s.get("why") or "")
    console.print(t)
    for name, s in rows_:
        cal = s.get("calibration")
        if cal:
            console.print(
                f"{name}: calibrated by kvbench on {cal.get('items')} held-out items of "
                f"{', '.join(cal.get('tasks') or [])} (seed {cal.get('seed')}, {cal.get('convention')} convention)"
            )
