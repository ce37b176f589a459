"""What the pages conclude from the data, in code: the recommended dtype, accuracy per serving dtype.
Each returns its reasoning in words, so the page can say how it was chosen."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

# Accuracy rows to show beside a serving dtype: attention on real K/V, with vLLM's default tensor scale
# (1.0: what `--kv-cache-dtype fp8|nvfp4` does without calibrated scales in the checkpoint).
ACCURACY_KIND = "real K/V"
DEFAULT_SCALE = "1"


@dataclass
class Recommendation:
    machine: str
    dtype: str | None
    concurrency: int | None
    why: str
    lines: list[str] = field(default_factory=list)  # one per dtype, each reason once (kvbench.analysis.verdict)
    run_id: str | None = None
    decision: object | None = None  # the kvbench.analysis.verdict.Decision it came from
    record: object | None = None  # the typed RunRecord it was decided on (for the verdict table)


def recommend(rows: pd.DataFrame, machine: str, records: list[dict]) -> Recommendation:
    """What kvbench.analysis.verdict.decide recommends for the newest run among `rows` (the function `kvbench report`
    calls, on the same typed record), with its line per dtype."""
    from kvbench.analysis.verdict import decide
    from kvbench.records import RunRecord

    newest = rows.sort_values("created_at").iloc[-1]["run_id"] if len(rows) else None
    doc = next((d for d in records if d.get("run_id") == newest), None)
    if doc is None:
        return Recommendation(machine, None, None, "no run record to decide from")
    # the pages hold records as load_record gave them: already upgraded to the v2 shape and validated
    record = RunRecord.model_validate({k: v for k, v in doc.items() if not k.startswith("_")})
    decision = decide(record)
    chosen = record.dtype(decision.recommended) if decision.recommended else None
    measured = chosen.capacity.measured if chosen is not None else None
    knee = measured.max_concurrency if measured is not None else None
    return Recommendation(machine, decision.recommended, knee, decision.why, decision.lines(), newest, decision, record)


def accuracy_format(dtype: str, activation: str = "bf16") -> str:
    """The accuracy study's format for a serving dtype: auto caches in the model's own dtype."""
    return activation if dtype == "auto" else dtype


def accuracy_for(accuracy: pd.DataFrame, dtype: str, activation: str = "bf16") -> dict | None:
    """Newest real-activation attention error for the dtype: {rel_l2, scale, machine, created_at, data}."""
    if accuracy.empty:
        return None
    fmt = accuracy_format(dtype, activation)
    rows = accuracy[(accuracy["kind"] == ACCURACY_KIND) & (accuracy["format"] == fmt)]
    if rows.empty:
        return None
    rows = rows[rows["created_at"] == rows["created_at"].max()]
    pick = rows[rows["scale"] == DEFAULT_SCALE]
    if pick.empty:
        pick = rows
    r = pick.iloc[0]
    return {
        "rel_l2": r["rel_l2"],
        "cos_mean": r["cos_mean"],
        "scale": r["scale"],
        "format": fmt,
        "machine": r["machine"],
        "created_at": r["created_at"],
        "data": r["data"],
    }
