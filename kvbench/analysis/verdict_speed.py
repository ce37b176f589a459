"""The speed half of a verdict: does one dtype serve more than another beyond noise, on a run record?

Two contests, in order:
- SLO capacity (the SLO search's knee). The search is not repeated, so each knee is known to lie between
  its highest met probe and the next missed one (the probes' bracket); a difference counts only when the
  brackets are further apart than the machine kind's noise floor for measured capacity (metrics.toml: the
  change identical runs show).
- Output throughput at the fixed load: with repeats, the paired difference over the repeats (same prompts)
  and its 95% t interval, beyond noise when the interval excludes 0; without repeats, the metric's noise
  floor from metrics.toml.
Within noise is a tie. Cost statements carry the same uncertainty: each side's throughput ± its repeats' 95%
half-width (or the noise floor), carried through price / throughput.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvbench.records import DtypeResult, PhaseKind, RunRecord, repeats

TIE = "tie"


@dataclass(frozen=True)
class Contest:
    """One speed comparison of a challenger with the dtype it would displace."""

    metric: str  # "SLO capacity" or "output throughput at the fixed load"
    challenger: str
    holder: str
    challenger_value: float
    holder_value: float
    winner: str  # a dtype, or "tie"
    how: str  # the interval or noise floor that decided it

    def text(self) -> str:
        unit = "requests" if self.metric == "SLO capacity" else "tokens/s"
        a, b = _num(self.challenger_value), _num(self.holder_value)
        head = f"{self.metric} {self.challenger} {a} vs {self.holder} {b} {unit}"
        return f"{head}: {'tie' if self.winner == TIE else self.winner + ' ahead'} ({self.how})"


def _num(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:,.3g}"


def machine_kind(record: RunRecord) -> str:
    return "gpu" if (record.environment or {}).get("gpus") else "cpu"


def _floor(metric: str, kind: str) -> tuple[float, float]:
    """(noise %, absolute noise) of a tracked metric on this machine kind (kvbench/data/metrics.toml)."""
    from kvbench.specs.tracked import by_name

    m = by_name()[metric]
    return m.floor_pct(kind), m.noise_abs


def bracket(d: DtypeResult) -> tuple[int, float] | None:
    """Where the SLO search puts the knee: (highest met probe, the next missed probe - 1; inf when capped)."""
    measured = d.capacity.measured
    if measured is None:
        return None
    m = measured.max_concurrency
    missed = [
        p.get("concurrency") for p in measured.probes if p.get("met") is False and (p.get("concurrency") or 0) > m
    ]
    if missed:
        return m, float(min(missed) - 1)
    return m, math.inf if measured.capped else float(m)


def capacity_contest(challenger: DtypeResult, holder: DtypeResult, kind: str) -> Contest | None:
    a, b = bracket(challenger), bracket(holder)
    if a is None or b is None:
        return None
    pct, floor_abs = _floor("measured_max_concurrency", kind)
    noise = max(floor_abs, pct / 100 * max(a[0], b[0]))
    if a[0] - b[1] > noise:
        winner = challenger.kv_cache_dtype
    elif b[0] - a[1] > noise:
        winner = holder.kv_cache_dtype
    else:
        winner = TIE
    how = (
        f"probes bracket {_span(a)} vs {_span(b)}; a difference within {noise:.3g} requests "
        f"({pct:g}% {kind} noise floor, metrics.toml) is a tie"
    )
    return Contest("SLO capacity", challenger.kv_cache_dtype, holder.kv_cache_dtype, a[0], b[0], winner, how)


def _span(b: tuple[int, float]) -> str:
    return f"{b[0]}" if b[1] == b[0] else f"{b[0]}..{'' if math.isinf(b[1]) else int(b[1])}"


def throughput(d: DtypeResult) -> tuple[float | None, list[float]]:
    """(output tokens/s at the fixed load, the repeats' values: [] without repeats)."""
    st = (d.fixed_stats or {}).get("output_throughput_tps")
    if st is not None and st.n >= 2:
        return st.mean, list(st.values)
    fixed = d.phase(PhaseKind.FIXED)
    return (fixed.summary.output_throughput_tps if fixed else None), []


def throughput_contest(challenger: DtypeResult, holder: DtypeResult, kind: str) -> Contest | None:
    (a, av), (b, bv) = throughput(challenger), throughput(holder)
    if a is None or b is None:
        return None
    paired = repeats.paired(av, bv) if av and bv and len(av) == len(bv) else None
    if paired is not None:
        lo, hi = paired["ci_low"], paired["ci_high"]
        winner = challenger.kv_cache_dtype if lo > 0 else holder.kv_cache_dtype if hi < 0 else TIE
        how = (
            f"paired difference over {paired['n']} repeats {paired['mean']:+,.0f} tokens/s, "
            f"95% CI {lo:+,.0f}..{hi:+,.0f}"
        )
    else:
        pct, _ = _floor("output_throughput", kind)
        diff = (a - b) / max(a, b) * 100 if max(a, b) > 0 else 0.0
        winner = TIE if abs(diff) <= pct else challenger.kv_cache_dtype if diff > 0 else holder.kv_cache_dtype
        how = f"no repeats: {diff:+.1f}% against the {pct:g}% {kind} noise floor (metrics.toml)"
    metric = "output throughput at the fixed load"
    return Contest(metric, challenger.kv_cache_dtype, holder.kv_cache_dtype, a, b, winner, how)


def relative_uncertainty(d: DtypeResult, kind: str) -> tuple[float, str]:
    """(fraction, where it came from) of a dtype's throughput: its repeats' 95% half-width over the mean,
    else the noise floor."""
    st = (d.fixed_stats or {}).get("output_throughput_tps")
    if st is not None and st.n >= 2 and st.ci_low is not None and st.mean:
        return (st.ci_high - st.ci_low) / 2 / st.mean, f"{st.n} repeats"
    pct, _ = _floor("output_throughput", kind)
    return pct / 100, f"{kind} noise floor"


def cost_lines(record: RunRecord) -> list[str]:
    """Each dtype's cost (or throughput) against auto from the front, with its interval; none for an emulated
    dtype, whose speed is not a GPU's."""
    kind, auto, out = machine_kind(record), record.dtype("auto"), []
    if auto is None:
        return out
    ra, wa = relative_uncertainty(auto, kind)
    for c in record.comparisons or []:
        d = record.dtype(c.get("kv_cache_dtype"))
        if d is None or d.emulated or auto.emulated:
            continue
        rd, wd = relative_uncertainty(d, kind)
        where_from = f"throughput ±{rd:.0%} ({wd}) and auto's ±{ra:.0%} ({wa})"
        for where, label in (("at_slo", "under the SLO"), ("at_target", "at the target interactivity")):
            v = (c.get("cost") or {}).get(where)
            if not v:
                continue
            line = _cost_line(d.kv_cache_dtype, label, v, rd, ra)
            if line:
                out.append(f"{line}; interval from {where_from}")
    return out


def _cost_line(dtype: str, label: str, v: dict, rd: float, ra: float) -> str | None:
    gain = v.get("throughput_gain_pct")
    if gain is None:
        return None
    ratio = 1 + gain / 100  # dtype throughput / auto's; cost scales with its inverse
    lo = ratio * (1 - rd) / (1 + ra) if ra > -1 else 0.0
    hi = ratio * (1 + rd) / (1 - ra) if ra < 1 else math.inf
    if v.get("saving_pct") is not None:
        s, s_lo, s_hi = (1 - 1 / ratio) * 100, (1 - 1 / lo) * 100 if lo > 0 else -math.inf, (1 - 1 / hi) * 100
        span = f"{_pct(s_lo)}..{_pct(s_hi)}"
        head = f"{dtype} vs auto {label}: USD {v['usd_per_m_output']:.3f} vs {v['auto_usd_per_m_output']:.3f} per M"
        if s_lo <= 0 <= s_hi:
            return f"{head}: no cost difference beyond noise (saving {s:+.1f}%, interval {span})"
        return f"{head}: {dtype} costs {abs(s):.1f}% {'less' if s > 0 else 'more'} (saving interval {span})"
    span = f"{_pct((lo - 1) * 100)}..{_pct((hi - 1) * 100)}"
    if lo <= 1 <= hi:
        return f"{dtype} vs auto {label}: throughput {gain:+.1f}%, within noise (interval {span})"
    return f"{dtype} vs auto {label}: throughput {gain:+.1f}% (interval {span}; --price-per-hour for the cost)"


def _pct(v: float) -> str:
    return "-inf" if v == -math.inf else "+inf" if v == math.inf else f"{v:+.0f}%"
