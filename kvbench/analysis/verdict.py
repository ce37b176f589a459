"""The recommendation: which KV dtype to run, from one typed run record. `report`, the dashboard, `compare`,
`claims` and the run itself all call `decide`; nothing else decides.

A dtype is eligible when it ran ok; the engine honoured it (no `not-honoured` finding) and the server
confirmed it; its task accuracy is `non-inferior` to auto within the budget (kvbench.analysis.verdict_accuracy; auto
is the reference); its canaries did not differ under load more often than auto's (Fisher's exact test,
one-sided); and it met the SLO at least at concurrency 1. An emulated dtype is never ranked on speed.

Among the eligible, the most precise is the incumbent; a less precise one displaces it only by winning a
contest beyond noise (kvbench.analysis.verdict_speed): SLO capacity first, then output throughput at the fixed load.
Within noise is a tie, and ties go to the more precise dtype: equal speed buys nothing for the accuracy
given up.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvbench.analysis import verdict_accuracy as acc
from kvbench.analysis import verdict_speed as speed
from kvbench.records import EMULATED_SPEED_REASON, DtypeResult, DtypeStatus, Finding, RunRecord
from kvbench.records.findings import FindingKind

REFERENCE = "auto"
TIE_BREAK = "ties go to the more precise dtype (auto, then fp8, then nvfp4)"
RECOMMENDED, ELIGIBLE, EXCLUDED, NOT_RANKED = "recommended", "eligible", "excluded", "not ranked"


@dataclass(frozen=True)
class Reason:
    kind: FindingKind
    text: str


@dataclass
class DtypeVerdict:
    dtype: str
    status: str  # recommended / eligible / excluded / not ranked
    accuracy: acc.AccuracyVerdict
    reasons: list[Reason] = field(default_factory=list)  # why excluded or not ranked, each once
    notes: list[str] = field(default_factory=list)  # what else the line says (accuracy verdict, speed)

    @property
    def eligible(self) -> bool:
        return self.status in (RECOMMENDED, ELIGIBLE)

    @property
    def breach(self) -> bool:
        """Shown worse than allowed (inferior accuracy, degrading under load, differing canaries), as opposed to
        not shown good enough (undecided, no eval): what fails a night."""
        worse = self.accuracy.state == acc.INFERIOR or self.accuracy.degrades_under_load
        return not self.eligible and (worse or any(r.kind == FindingKind.CANARY for r in self.reasons))

    @property
    def kind(self) -> FindingKind | None:
        return self.reasons[0].kind if self.reasons else None

    def line(self) -> str:
        """One readable line: status, then each reason once, then the rest."""
        parts = [r.text for r in self.reasons] + [n for n in self.notes if n not in {r.text for r in self.reasons}]
        return f"{self.dtype}: {self.status}" + (": " + "; ".join(parts) if parts else "")


@dataclass
class Decision:
    policy: acc.Policy
    dtypes: dict[str, DtypeVerdict]
    recommended: str | None
    why: str
    contests: list[speed.Contest] = field(default_factory=list)

    method = (
        "accuracy: Tango score test for paired proportions, one-sided, all tasks' items pooled as the primary "
        "endpoint; non-inferior: each test at the full level (intersection-union); inferior: Holm over the tests; "
        "speed: SLO capacity beyond the probes' bracket and noise floor, then throughput beyond its repeats' "
        f"95% CI or noise floor; {TIE_BREAK}"
    )

    def headline(self) -> str:
        if self.recommended is None:
            return f"no dtype recommended: {self.why}"
        return f"recommended: {self.recommended}: {self.why}"

    def lines(self) -> list[str]:
        return [v.line() for v in self.dtypes.values()]

    def as_dict(self) -> dict:
        """What the record's `quality` block stores (and `--json` prints)."""
        return {
            "budget_points": self.policy.budget,
            "budgets": self.policy.budgets,
            "confidence": self.policy.confidence,
            "method": self.method,
            "gate": {
                d: {
                    "eligible": v.eligible,
                    "status": v.status,
                    "accuracy": v.accuracy.state,
                    "kind": v.kind.value if v.kind else None,
                    "breach": v.breach,
                    "reason": "; ".join(r.text for r in v.reasons) or v.accuracy.reason(),
                    "line": v.line(),
                    "comparisons": _comparisons(v.accuracy),
                }
                for d, v in self.dtypes.items()
            },
            "recommendation": {
                "dtype": self.recommended,
                "why": self.why,
                "contests": [c.text() for c in self.contests],
                "excluded": {d: v.line() for d, v in self.dtypes.items() if not v.eligible},
            },
        }

    def findings(self) -> list[Finding]:
        """A finding per dtype kept out by its accuracy, canaries or degenerate answers, or not ranked for its
        emulation (the engine's `not-honoured` and a run's failure are recorded where they are found; an
        unconfirmed dtype is the endpoint's own record of what it said, and its line says why it is out)."""
        kinds = (FindingKind.ACCURACY, FindingKind.CANARY, FindingKind.DEGENERATE, FindingKind.EMULATED)
        out = []
        for v in self.dtypes.values():
            for r in v.reasons:
                if r.kind in kinds and not (r.kind == FindingKind.ACCURACY and v.accuracy.state == acc.NO_EVAL):
                    verb = (
                        "not ranked on speed" if r.kind == FindingKind.EMULATED else "excluded from the recommendation"
                    )
                    out.append(Finding(level="warning", dtype=v.dtype, kind=r.kind, text=f"{v.dtype} {verb}: {r.text}"))
        if REFERENCE in self.dtypes and self.dtypes[REFERENCE].accuracy.degrades_under_load:
            text = self.dtypes[REFERENCE].accuracy.under_load_text()
            text = f"auto (the reference) has {text}: every comparison at load is with a degraded reference"
            out.append(Finding(level="warning", dtype=REFERENCE, kind=FindingKind.ACCURACY, text=text))
        return out


def _comparisons(a: acc.AccuracyVerdict) -> list[dict]:
    """Every comparison the accuracy verdict rests on, pooled first, with its looks and items (one look each
    until kvbench.core.sequential's extra looks are wired into the run: docs/guide/verdict.md)."""
    out = []
    for t in ([a.primary] if a.primary is not None else []) + list(a.tests):
        r = t.result
        out.append(
            {
                "endpoint": "primary (pooled)" if t.pooled else "secondary",
                "task": t.task,
                "tasks": list(t.pooled) or [t.task],
                "conditions": list(t.conditions),
                "items": r.n,
                "losses": r.losses,
                "gains": r.gains,
                "looks": 1,
                "drop_points": t.drop,
                "bound_points": -(r.upper if r.verdict == acc.INFERIOR else r.lower) * 100,
                "level": 1 - r.alpha_used,
                "verdict": r.verdict,
                "items_needed": r.items_needed,
            }
        )
    return out


LINE_KINDS = (
    FindingKind.NOT_HONOURED,
    FindingKind.UNCONFIRMED,
    FindingKind.ACCURACY,
    FindingKind.CANARY,
    FindingKind.DEGENERATE,
    FindingKind.EMULATED,
    FindingKind.FAILED,
    FindingKind.UNSUPPORTED,
)


def shown_in_lines(finding: dict | Finding, decision: Decision) -> bool:
    """Whether a finding says what its dtype's line already says (printed once, there)."""
    from kvbench.records.findings import parse_kind

    f = finding.model_dump() if isinstance(finding, Finding) else finding
    return f.get("dtype") in decision.dtypes and parse_kind(f) in LINE_KINDS


def precision_key(dtype: str) -> tuple[int, int, str]:
    """Most precise first: more data bits (auto is the model's 16), then the registry's order (formats.toml)."""
    from kvbench.core.errors import UsageError
    from kvbench.specs.formats import get_format, order_key

    try:
        fmt = get_format(dtype)
    except UsageError:
        return (0, order_key(dtype)[0], dtype)
    return (-(16 if fmt.key == REFERENCE else fmt.data_bits), order_key(fmt.key)[0], dtype)


def decide(record: RunRecord, policy: acc.Policy | None = None) -> Decision:
    """The recommendation for a typed run record, with one verdict (and line) per dtype."""
    policy = policy or acc.settings(record)
    accuracy = acc.judge(record, policy)
    verdicts = {d.kv_cache_dtype: _verdict(record, d, accuracy[d.kv_cache_dtype], policy) for d in record.dtypes}
    eligible = sorted((k for k, v in verdicts.items() if v.eligible), key=precision_key)
    if not eligible:
        why = "no dtype is eligible (each line says why)" if verdicts else "the record holds no dtype"
        unchecked = [d.kv_cache_dtype for d in record.dtypes if _unchecked_label(d)]
        if len(unchecked) > 1:  # nothing shows these servers run different KV dtypes at all
            why = f"{', '.join(unchecked)} are labels their servers did not confirm (unchecked): no recommendation"
        return Decision(policy, verdicts, None, why)
    holder, contests = eligible[0], []
    kind = speed.machine_kind(record)
    for challenger in eligible[1:]:
        won, fought = _challenge(record.dtype(challenger), record.dtype(holder), kind)
        contests += fought
        if won:
            holder = challenger
    verdicts[holder].status = RECOMMENDED
    return Decision(policy, verdicts, holder, _why(holder, eligible, contests), contests)


def _unchecked_label(d: DtypeResult) -> bool:
    """An --endpoint label its server did not confirm (a managed server's dtype is the flag kvbench gave it)."""
    return d.kv_dtype_confirmed is None and d.server is not None and not d.server.managed


def _challenge(challenger: DtypeResult, holder: DtypeResult, kind: str) -> tuple[bool, list[speed.Contest]]:
    """Whether the less precise challenger displaces the holder: the first contest decided beyond noise."""
    fought = []
    for contest in (speed.capacity_contest, speed.throughput_contest):
        c = contest(challenger, holder, kind)
        if c is None:
            continue
        fought.append(c)
        if c.winner != speed.TIE:
            return c.winner == challenger.kv_cache_dtype, fought
    return False, fought


def _why(pick: str, eligible: list[str], contests: list[speed.Contest]) -> str:
    if len(eligible) == 1:
        return "the only eligible dtype"
    deciding = [c for c in contests if pick in (c.challenger, c.holder)]
    texts = "; ".join(c.text() for c in deciding) or "nothing in this run ranks them"
    if all(c.winner == speed.TIE for c in deciding):
        return f"tie with {', '.join(e for e in eligible if e != pick)} ({texts}); {TIE_BREAK}"
    return texts


def _verdict(record: RunRecord, d: DtypeResult, accuracy: acc.AccuracyVerdict, policy: acc.Policy) -> DtypeVerdict:
    reasons = []
    if d.status != DtypeStatus.OK:
        kind = FindingKind.UNSUPPORTED if d.status == DtypeStatus.UNSUPPORTED else FindingKind.FAILED
        reasons.append(Reason(kind, f"run {d.status.value}: {_first_line(d.error) or 'no detail'}"))
    for f in record.findings:
        if f.dtype == d.kv_cache_dtype and f.kind == FindingKind.NOT_HONOURED:
            reasons.append(Reason(f.kind, _not_honoured(f)))
    if d.kv_dtype_confirmed is False:
        reasons.append(Reason(FindingKind.UNCONFIRMED, "the server reported another KV dtype"))
    elif d.kv_dtype_confirmed is None and d.server is not None and not d.server.managed:
        reasons.append(Reason(FindingKind.UNCONFIRMED, "unconfirmed: the server does not say which KV dtype it runs"))
    if not accuracy.eligible and d.status == DtypeStatus.OK:
        reasons.append(Reason(FindingKind.ACCURACY, accuracy.reason()))
    canary = _canaries(record, d, 1 - policy.confidence)
    if canary:
        reasons.append(Reason(FindingKind.CANARY, canary))
    auto = record.dtype(REFERENCE)
    if d.kv_cache_dtype != REFERENCE and auto is not None:
        junk = acc.degenerate_excess(d.eval, auto.eval, 1 - policy.confidence)
        if junk:
            reasons.append(Reason(FindingKind.DEGENERATE, junk))
    measured = d.capacity.measured
    if measured is not None and measured.max_concurrency == 0 and not d.emulated:
        reasons.append(Reason(FindingKind.OTHER, "misses the SLO even at concurrency 1"))
    notes = [accuracy.reason()] if accuracy.eligible and accuracy.state != acc.REFERENCE_STATE else []
    if d.kv_cache_dtype == REFERENCE and accuracy.degrades_under_load:
        notes.append(accuracy.under_load_text())
    if d.emulated:
        note = EMULATED_SPEED_REASON + "; not ranked on speed"
        if reasons:
            notes.append(note)
        else:
            return DtypeVerdict(d.kv_cache_dtype, NOT_RANKED, accuracy, [Reason(FindingKind.EMULATED, note)], notes)
    notes += _agreement(d)
    if not d.eval and d.status == DtypeStatus.OK and not _canary_counts(d)[0]:
        notes.append("no canary sent either: its answers under load are unchecked")
    return DtypeVerdict(d.kv_cache_dtype, EXCLUDED if reasons else ELIGIBLE, accuracy, reasons, notes)


def _not_honoured(f: Finding) -> str:
    extra = f.model_extra or {}
    if "engine_ratio" in extra and "format_ratio" in extra:
        return (
            f"probably not honoured by the engine: it holds {extra['engine_ratio']:.2f}x auto's KV tokens, "
            f"the format implies {extra['format_ratio']:.2f}x"
        )
    return "probably not honoured by the engine"


def _canaries(record: RunRecord, d: DtypeResult, alpha: float) -> str | None:
    """Canaries differing under load more often than auto's, by Fisher's exact test (one-sided)."""
    auto = record.dtype(REFERENCE)
    if auto is None or d.kv_cache_dtype == REFERENCE:
        return None
    (sd, dd), (sa, da) = _canary_counts(d), _canary_counts(auto)
    if not sd or not sa or dd / sd <= da / sa:
        return None
    from scipy.stats import fisher_exact

    p = float(fisher_exact([[dd, sd - dd], [da, sa - da]], alternative="greater").pvalue)
    if p > alpha:
        return None
    return f"canaries: {dd} of {sd} differed under load vs auto's {da} of {sa} (Fisher exact one-sided p = {p:.3g})"


def _canary_counts(d: DtypeResult) -> tuple[int, int]:
    sent = differ = 0
    for p in d.phases:
        c = p.canaries or {}
        sent += c.get("sent", 0) - c.get("failed", 0)
        differ += c.get("differ", 0)
    return sent, differ


def _agreement(d: DtypeResult) -> list[str]:
    """Per-token agreement with auto, informational: fidelity's top-1 (teacher-forced, the same prefix at every
    position) where the record has it; the free-running share of positions beside it, said as what it is (after
    the first differing token the two outputs continue from different text, so it is no per-token rate)."""
    vs = (d.agreement.vs_auto if d.agreement else None) or {}
    share = vs.get("token_agreement")
    top1 = ((d.fidelity or {}).get("rest") or {}).get("top1_agreement")
    free = None if share is None else f"free-running greedy outputs match auto's at {share:.1%} of positions"
    if top1 is not None:
        text = f"top token agrees with auto's {top1:.1%} teacher-forced"
        if free:  # identical outputs never part
            text += f" ({free}: they part at the first differing token)" if share < 1 else f" ({free})"
        return [text + " (informational: task accuracy decides)"]
    if free is None:
        return []
    return [f"{free}, diverging after the first differing token (informational: task accuracy decides)"]


def _first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0][:200] if (text or "").strip() else ""
