"""The verdict as one table, the same on `kvbench report` and the dashboard's Overview: per dtype its verdict,
capacity vs auto, speed vs auto (the interval, or "tie"), the accuracy drop and its bound vs the budget, mean
KLD and top-token agreement (fidelity per token, when the record has it), and one short reason. Built from
kvbench.analysis.verdict.decide's Decision, never decided again here."""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.analysis import verdict_accuracy as acc
from kvbench.analysis import verdict_speed as speed
from kvbench.records import RunRecord

COLUMNS = (
    "dtype",
    "verdict",
    "capacity vs auto",
    "speed vs auto",
    "accuracy drop (bound) vs budget",
    "mean KLD",
    "top-token agreement",
    "reason",
)
NONE = "—"
SHORT_KINDS = {
    "failed": "the run failed or stopped (the statement says where)",
    "unsupported": "vLLM refused the dtype",
    "not-honoured": "probably not honoured by the engine (capacity vs the format)",
    "unconfirmed": "the server did not confirm the dtype",
    "canary": "canaries came back different under load more often than auto's",
    "degenerate": "degenerate answers more often than auto's",
    "other": "misses the SLO even one request at a time",  # the one OTHER reason kvbench.analysis.verdict gives
}


@dataclass(frozen=True)
class Row:
    dtype: str
    verdict: str
    capacity: str
    speed: str
    accuracy: str
    kld: str
    agreement: str
    reason: str
    state: str  # the accuracy state, for colouring

    def cells(self) -> list[str]:
        return [
            self.dtype,
            self.verdict,
            self.capacity,
            self.speed,
            self.accuracy,
            self.kld,
            self.agreement,
            self.reason,
        ]


def rows(record: RunRecord, decision) -> list[Row]:
    auto = record.dtype(acc.REFERENCE)
    kind = speed.machine_kind(record)
    out = []
    for name, v in decision.dtypes.items():
        d = record.dtype(name)
        out.append(
            Row(
                dtype=name,
                verdict=_verdict(v),
                capacity=_capacity(d, auto),
                speed=_speed(d, auto, kind),
                accuracy=_accuracy(v.accuracy),
                kld=_fidelity(d, "mean_kld", "mean_kld_ci", "{:.3g}", _floor(auto)),
                agreement=_fidelity(d, "top1_agreement", "top1_agreement_ci", "{:.1%}"),
                reason=short_reason(v, decision),
                state=v.accuracy.state,
            )
        )
    return out


def _verdict(v) -> str:
    state = v.accuracy.state
    if state in (acc.REFERENCE_STATE,):
        return f"{v.status} (reference)"
    return f"{v.status} ({state})"


def _capacity(d, auto) -> str:
    """The engine's KV tokens against auto's (what vLLM said it allocated)."""
    if d is None or auto is None or d.capacity.engine is None or auto.capacity.engine is None:
        return NONE
    if d.kv_cache_dtype == acc.REFERENCE:
        return f"{d.capacity.engine.kv_tokens:,} tokens"
    return f"{d.capacity.engine.kv_tokens / auto.capacity.engine.kv_tokens:.2f}x tokens"


def _speed(d, auto, kind: str) -> str:
    if d is None or auto is None or d.kv_cache_dtype == acc.REFERENCE:
        return NONE
    if d.emulated:
        return "emulated (not ranked)"
    c = speed.throughput_contest(d, auto, kind)
    if c is None:
        return NONE
    diff = (c.challenger_value / c.holder_value - 1) * 100 if c.holder_value else float("nan")
    if c.winner == speed.TIE:
        return f"tie ({diff:+.0f}% within noise)"
    lo, hi = _interval(d, auto, kind)
    return f"{diff:+.0f}% ({lo:+.0f}..{hi:+.0f}%)"


def _interval(d, auto, kind: str) -> tuple[float, float]:
    """The throughput ratio's range from each side's relative uncertainty (repeats' 95% CI or noise floor)."""
    (a, _), (b, _) = speed.throughput(d), speed.throughput(auto)
    ra, _ = speed.relative_uncertainty(d, kind)
    rb, _ = speed.relative_uncertainty(auto, kind)
    return (a * (1 - ra) / (b * (1 + rb)) - 1) * 100, (a * (1 + ra) / (b * (1 - rb)) - 1) * 100


def lead_test(a: acc.AccuracyVerdict):
    """The test a dtype's accuracy verdict leads with: the pooled endpoint, else the worst task."""
    if a.primary is not None:
        return a.primary
    return max(a.tests, key=lambda t: t.drop) if a.tests else None


def _accuracy(a: acc.AccuracyVerdict) -> str:
    t = lead_test(a)
    if t is None:
        return NONE if a.state == acc.REFERENCE_STATE else a.state
    r = t.result
    bound = -r.upper * 100 if r.verdict == acc.INFERIOR else -r.lower * 100
    sign = ">" if r.verdict == acc.INFERIOR or (r.verdict == acc.UNDECIDED and bound > t.budget) else "<="
    word = "at least" if r.verdict == acc.INFERIOR else "at most"
    where = "pooled" if t.pooled else t.task
    drop = f"drop {t.drop:.1f}" if t.drop >= 0 else f"gain {-t.drop:.1f}"
    return f"{drop} pts ({word} {bound:.1f}) {sign} {t.budget:g}, {where}, {r.n:,} items"


def _floor(auto) -> dict | None:
    """Auto under load scored against auto at rest: batch variance alone, the benign reference."""
    return ((getattr(auto, "fidelity", None) or {}) if auto is not None else {}).get("load")


def _fidelity(d, key: str, ci_key: str, fmt: str, floor: dict | None = None) -> str:
    """Per condition the value and its 95% CI; with `floor`, "no measurable change" where a dtype's KLD and
    agreement cannot be told from auto's own batch variance (kvbench.core.fidelity_stats; informs, never decides)."""
    from kvbench.core.fidelity_stats import no_measurable_change

    fid = getattr(d, "fidelity", None) if d is not None else None
    if not fid:
        return NONE
    parts = []
    for cond in ("rest", "load"):
        s = fid.get(cond) or {}
        if s.get(key) is None:
            continue
        ci = s.get(ci_key) or []
        band = f" [{fmt.format(ci[0])}, {fmt.format(ci[1])}]" if len(ci) == 2 and None not in ci else ""
        same = floor is not None and d.kv_cache_dtype != acc.REFERENCE and no_measurable_change(s, floor)
        parts.append(f"{cond} {fmt.format(s[key])}{band}" + (" (no measurable change)" if same else ""))
    return "; ".join(parts) or NONE


def short_reason(v, decision) -> str:
    """One short reason: what decides this dtype's place."""
    from kvbench.records.findings import FindingKind

    a = v.accuracy
    if v.status == "recommended":
        return decision.why if len(decision.why) <= 90 else decision.why.split(" (")[0]
    first = v.reasons[0] if v.reasons else None
    if first is not None and first.kind not in (FindingKind.ACCURACY, FindingKind.EMULATED):
        # a failed run, an engine that did not honour the dtype, canaries: named by kind (the text is the statement's)
        return SHORT_KINDS.get(first.kind.value, first.kind.value.replace("-", " "))
    if a.state == acc.INFERIOR:
        t = lead_test(a) if (a.primary and a.primary.result.verdict == acc.INFERIOR) else _worst_inferior(a)
        if t is None:
            return "accuracy inferior"
        where = "pooled" if t.pooled else t.task
        return f"accuracy inferior: {where} drop {t.drop:.1f} pts, at least {-t.result.upper * 100:.1f} > {t.budget:g}"
    if a.degrades_under_load:
        return "accuracy inferior under load to its own answers at rest"
    if a.state == acc.UNDECIDED:
        t = lead_test(a)
        need = t.result.items_needed if t is not None else None
        return f"accuracy undecided: about {need:,} items would decide it" if need else "accuracy undecided"
    if a.state in (acc.NO_EVAL, acc.EVAL_FAILED):
        return a.state
    if v.reasons:
        return _clip(v.reasons[0].text)
    return "eligible: loses to the recommendation on speed or ties" if v.eligible else _clip(v.line())


def _worst_inferior(a):
    bad = [t for t in a.tests if t.result.verdict == acc.INFERIOR]
    return max(bad, key=lambda t: t.drop) if bad else None


def _clip(text: str, n: int = 90) -> str:
    return text if len(text) <= n else text[: n - 1].rstrip() + "…"
