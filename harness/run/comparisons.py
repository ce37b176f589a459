"""Each dtype of a run against auto: the paired difference of every repeated headline metric, and what the
front says about cost at the SLO and at the target interactivity. The record's `comparisons`."""

from __future__ import annotations

from kvbench.core import front
from kvbench.records import DtypeStatus, RunRecord, repeats


def comparisons(record: RunRecord) -> list[dict]:
    """Each dtype against auto: the paired difference of every repeated headline metric (95% t interval;
    beyond noise when it excludes 0), and what the front says about cost at the SLO and at the target."""
    auto = record.dtype("auto")
    if auto is None:
        return []
    out = []
    for d in record.dtypes:
        if d.kv_cache_dtype == "auto" or d.status != DtypeStatus.OK or d.emulated:  # emulated speed: not compared
            continue
        row: dict = {"kv_cache_dtype": d.kv_cache_dtype, "metrics": {}, "cost": {}}
        for metric, st in (d.fixed_stats or {}).items():
            base = (auto.fixed_stats or {}).get(metric)
            if base is not None:
                diff = repeats.paired(st.values, base.values)
                if diff is not None:
                    row["metrics"][metric] = diff
        if d.front and auto.front:
            for where in ("at_slo", "at_target"):
                mine, theirs = getattr(d.front, where), getattr(auto.front, where)
                if mine and theirs:
                    row["cost"][where] = _cost(mine, theirs)
        out.append(row)
    return out


def _cost(mine: dict, theirs: dict) -> dict:
    """One front point of the dtype (at the SLO or the target) against auto's."""
    saving = front.saving_pct(mine.get("usd_per_m_output"), theirs.get("usd_per_m_output"))
    a, b = mine.get("output_tps_per_gpu"), theirs.get("output_tps_per_gpu")
    gain = (a / b - 1) * 100 if a and b else None
    return {
        "usd_per_m_output": mine.get("usd_per_m_output"),
        "auto_usd_per_m_output": theirs.get("usd_per_m_output"),
        "saving_pct": saving,
        "throughput_gain_pct": gain,
        "user_tps": mine.get("user_tps"),
        "concurrency": mine.get("concurrency"),
    }
