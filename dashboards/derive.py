"""What the pages conclude from the data, in code: the recommended dtype, accuracy per serving dtype,
release boundaries. Each returns its reasoning in words, so the page can say how it was chosen."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from kvbench.dashboards.components import is_missing
from kvbench.dashboards.theme import dtype_sort_key

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
    excluded: list[str] = field(default_factory=list)


def recommend(rows: pd.DataFrame, machine: str) -> Recommendation:
    """The dtype with the highest SLO-measured concurrency among those that ran ok, were honoured and passed
    the run's quality gate (not significantly less accurate than auto, within the budget, also under load).

    Ties go to the more precise dtype (auto before fp8 before nvfp4): equal capacity buys nothing for the
    accuracy given up. A dtype the engine probably did not honour is excluded: its numbers are another
    dtype's."""
    excluded, candidates = [], []
    for _, r in rows.iterrows():
        d = r["kv_cache_dtype"]
        if r.get("status") != "ok":
            excluded.append(f"{d}: run {r.get('status')} (see failures)")
        elif not r.get("honoured", True):
            excluded.append(f"{d}: probably not honoured by the engine")
        elif r.get("quality_eligible") is False:  # the run's quality gate (accuracy vs auto, at load, canaries)
            excluded.append(f"{d}: excluded: {r.get('quality_reason')}")
        elif is_missing(r.get("measured_max_concurrency")):
            excluded.append(f"{d}: no SLO search in this run")
        elif r["measured_max_concurrency"] <= 0:
            excluded.append(f"{d}: misses the SLO even at concurrency 1")
        else:
            candidates.append((int(r["measured_max_concurrency"]), d))
    if not candidates:
        return Recommendation(machine, None, None, "no dtype ran ok and met the SLO at any concurrency", excluded)
    best = max(c for c, _ in candidates)
    tied = sorted((d for c, d in candidates if c == best), key=dtype_sort_key)
    why = "most concurrent requests within the SLO"
    if len(tied) > 1:
        why += f" (tied with {', '.join(tied[1:])}; the more precise dtype wins the tie)"
    return Recommendation(machine, tied[0], best, why, excluded)


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


def release_boundaries(points: pd.DataFrame, x: str = "commit_date", version: str = "vllm_version") -> list[tuple]:
    """(x where a new vLLM version starts, version, previous version) along a time-ordered series."""
    if points.empty:
        return []
    firsts = points.sort_values(x).drop_duplicates(subset=[x]).reset_index(drop=True)
    out = []
    prev = None
    for _, r in firsts.iterrows():
        v = r[version]
        if prev is not None and v != prev:
            out.append((r[x], v, prev))
        prev = v
    return out
