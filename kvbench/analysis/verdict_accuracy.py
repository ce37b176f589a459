"""The accuracy half of a verdict: is each dtype non-inferior to auto within the budget, on a run record?

The primary endpoint is pooled: every task's items at rest (else the first condition evaluated) together, one
paired comparison with auto (the sums of the `vs_auto` blocks harness/quality/underload.py stores: n, losses, gains),
tested against the budget with Tango's score test (kvbench.core.noninferiority). Secondary: each task and
condition on its own. Non-inferior runs at the full level (intersection-union, Berger 1982); "inferior" is
Holm-adjusted over the primary and the secondary tests together, and a secondary "inferior" still excludes.
Conditions whose answers are identical item by item (the same score fingerprint on both sides) are one test,
printed once;
records from before fingerprints merge conditions with the same counts and say "same counts".

Verdicts: `non-inferior` (the pooled bound inside the budget, no test inferior), `inferior` (some bound beyond it),
`undecided` (neither: too few items; the items that would decide it at 80% power are given), `no eval`,
`eval failed`; auto is the `reference`. Only `non-inferior` (and the reference) make a dtype eligible.

Separately, each dtype at load is tested against itself at rest (`vs_rest`): a dtype that is inferior under
load to its own at-rest answers is excluded too, and auto doing so is reported (every comparison is then
against a reference that degrades under load).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from kvbench.core import noninferiority as ni
from kvbench.records import CONDITIONS, RunRecord, blocks, conditions
from kvbench.records.findings import DEGENERATE_KINDS

REFERENCE = "auto"
REFERENCE_STATE, NO_EVAL, EVAL_FAILED = "reference", "no eval", "eval failed"
NON_INFERIOR, INFERIOR, UNDECIDED = ni.NON_INFERIOR, ni.INFERIOR, ni.UNDECIDED
SHORT = CONDITIONS  # what each condition is called (kvbench/records/schema.py)


@dataclass(frozen=True)
class Test:
    """One paired comparison a verdict rests on (identical conditions merged)."""

    task: str
    against: str  # "auto" or "itself at rest"
    conditions: tuple[str, ...]
    labels: tuple[str, ...]  # what each condition was, with each side's concurrency
    merged: str | None  # "identical" (item by item) or "same counts" (an older record), when several
    accuracy: float | None
    reference_accuracy: float | None
    budget: float  # points
    result: ni.Result
    pooled: tuple[str, ...] = ()  # the tasks the primary endpoint pools (empty: a per-task test)

    @property
    def drop(self) -> float:
        """Points lost against the reference (negative: gained)."""
        return 0.0 - self.result.difference * 100  # never "-0.0"

    def where(self) -> str:
        """'at rest (...)', or 'identical at rest (...), at load (...) and during load (...)'."""
        if len(self.labels) == 1:
            return self.labels[0]
        return f"{self.merged} " + ", ".join(self.labels[:-1]) + f" and {self.labels[-1]}"

    def text(self) -> str:
        """'kvbench_passkey_512 99.6% vs 100.0%, drop 0.4 points (one-sided 95% bound 1.1 > budget 1.0; ...)'."""
        r = self.result
        level = f"one-sided {100 * (1 - r.alpha_used):.4g}%"
        if r.verdict == INFERIOR:  # the smallest drop the data allow is beyond the budget
            bound = f"{level} bound {-r.upper * 100:.1f} > budget {self.budget:.1f}, Tango p = {_p(r.p_inferior)}"
        else:
            sign = "<=" if r.verdict == NON_INFERIOR else ">"
            bound = (
                f"{level} bound {-r.lower * 100:.1f} {sign} budget {self.budget:.1f}, Tango p = {_p(r.p_noninferior)}"
            )
        acc = ""
        if self.accuracy is not None and self.reference_accuracy is not None:
            ref = "at rest" if self.against != REFERENCE else REFERENCE
            acc = f" {self.accuracy * 100:.1f}% vs {ref} {self.reference_accuracy * 100:.1f}%,"
        word = "drop" if self.drop >= 0 else "gain"
        out = f"{self.task}{acc} {word} {abs(self.drop):.1f} points ({bound}; {self.where()})"
        if r.items_needed is not None:
            out += f"; about {r.items_needed:,} items would decide it at 80% power"
        elif r.verdict == UNDECIDED:
            out += "; the observed drop equals the budget: no number of items decides it"
        return out


@dataclass(frozen=True)
class AccuracyVerdict:
    dtype: str
    state: str
    tests: tuple[Test, ...] = ()
    under_load: tuple[Test, ...] = ()  # this dtype at load vs itself at rest
    note: str | None = None  # why there is no verdict (no eval, failed eval, no paired comparison)
    gaps: tuple[str, ...] = field(default=())  # tasks without a 0/1 paired comparison
    primary: Test | None = None  # the pooled endpoint (all tasks' items together)

    @property
    def eligible(self) -> bool:
        return self.state in (REFERENCE_STATE, NON_INFERIOR) and not self.degrades_under_load

    @property
    def degrades_under_load(self) -> bool:
        return any(t.result.verdict == INFERIOR for t in self.under_load)

    def reason(self) -> str:
        """The accuracy part of the dtype's line, each fact once."""
        head = self.state if self.state in (NO_EVAL, EVAL_FAILED, REFERENCE_STATE) else f"accuracy {self.state}"
        if self.note:
            return f"{head}: {self.note}"
        deciding = [t for t in self.tests if t.result.verdict == self.state] or list(self.tests)
        if self.primary is not None:  # the pooled endpoint leads; the per-task tests it rests on follow
            lead = [self.primary] if self.state != INFERIOR or self.primary.result.verdict == INFERIOR else []
            deciding = lead + [t for t in deciding if t.result.verdict == self.state or not lead]
        parts = [f"{head}: " + "; ".join(t.text() for t in deciding)] if deciding else [head]
        if self.gaps:
            parts.append(f"no paired 0/1 comparison for {', '.join(self.gaps)}")
        if self.degrades_under_load:  # the excluding reason comes first
            parts.insert(0 if self.state != INFERIOR else 1, self.under_load_text())
        return "; ".join(p for p in parts if p != REFERENCE_STATE)

    def under_load_text(self) -> str:
        worse = [t for t in self.under_load if t.result.verdict == INFERIOR]
        return "accuracy inferior under load to its own at rest: " + "; ".join(t.text() for t in worse)


@dataclass(frozen=True)
class Policy:
    """What a verdict is held to: the budget in points (per task where given) and the confidence."""

    budget: float
    budgets: dict[str, float]
    confidence: float

    def margin(self, task: str) -> float:
        return self.budgets.get(task, self.budget)


def settings(record: RunRecord) -> Policy:
    """The policy the run was planned with (run_defaults.toml for records that did not store it)."""
    confidence, budget, budgets = blocks.policy(record.config, record.environment)
    return Policy(budget, budgets, confidence)


def _label(cond: str, mine: dict, ref: dict | None, dtype: str, against: str) -> str:
    """What a condition was, with the concurrency each side ran at: 'at load (fp8 33 in flight, auto 16)'."""
    c, rc = mine.get("concurrency"), (ref or {}).get("concurrency")
    name = SHORT.get(cond, cond)
    if cond == "rest":
        return f"{name} (1 request at a time)"
    if cond in ("during_load", "mixed"):
        traffic = mine.get("traffic") or {}
        mode = traffic.get("mode") or {}
        beside = f"concurrency-{mode['concurrency']} traffic" if "concurrency" in mode else "the fixed load"
        if traffic.get("prompt_tokens"):
            beside += f" of {traffic['prompt_tokens']}-token prompts, {traffic.get('output_tokens')} out"
        return f"{name} ({c or 1} at a time beside {beside})"
    if cond == "prefix":
        share = mine.get("prefix_share")
        cached = f"the first {share:.0%} of each prompt" if share else "each prompt's prefix"
        return f"{name} (1 at a time, {cached} cached by an earlier request)"
    if against != REFERENCE:
        return f"{name} ({c} in flight, vs 1 at rest)"
    if rc is not None and rc != c:
        return f"{name} ({dtype} {c} in flight, {REFERENCE} {rc})"
    return f"{name} ({c} in flight on both)"


def _tests(pairs: list[tuple], dtype: str, against: str, policy: Policy, extra: Test | None = None) -> tuple[Test, ...]:
    """Group identical comparisons, then Holm over the groups. pairs: (task, condition, entry, the
    reference's entry, own condition summary, the reference's condition summary); entry["vs_auto"] or
    entry["vs_rest"] is the stored comparison."""
    key_name = "vs_auto" if against == REFERENCE else "vs_rest"
    groups: dict[tuple, list] = {}
    for task, cond, entry, ref_entry, summary, ref_summary in pairs:
        vs = entry[key_name]
        mine, theirs = entry.get("scores_sha256"), (ref_entry or {}).get("scores_sha256")
        key = (
            (task, "identical", mine, theirs)
            if mine and theirs
            else (task, "same counts", vs["n"], vs["losses"], vs["gains"], entry.get("correct"))
        )
        groups.setdefault(key, []).append((cond, entry, ref_entry, summary, ref_summary))
    tables = []
    for key, members in groups.items():
        vs = members[0][1][key_name]
        tables.append((vs["losses"], vs["gains"], vs["n"], policy.margin(key[0]) / 100))
    if extra is not None:  # the primary joins the Holm family on the "inferior" side, and comes back last
        r = extra.result
        tables.append((r.losses, r.gains, r.n, extra.budget / 100))
    results = ni.decide(tables, policy.confidence) if tables else []
    if extra is not None:
        *results, last = results
    out = []
    for (key, members), result in zip(groups.items(), results, strict=True):
        _, entry, ref_entry, *_ = members[0]
        mine, theirs = paired_accuracy(entry, ref_entry, entry[key_name])
        out.append(
            Test(
                task=key[0],
                against=against,
                conditions=tuple(m[0] for m in members),
                labels=tuple(_label(m[0], m[3], m[4], dtype, against) for m in members),
                merged=key[1] if len(members) > 1 else None,
                accuracy=mine,
                reference_accuracy=theirs,
                budget=policy.margin(key[0]),
                result=result,
            )
        )
    if extra is not None:
        from dataclasses import replace

        out.append(replace(extra, result=last))
    return tuple(out)


def judge(record: RunRecord, policy: Policy) -> dict[str, AccuracyVerdict]:
    """{dtype: AccuracyVerdict} for every dtype of the record."""
    auto = record.dtype(REFERENCE)
    ref_evals = dict(conditions(auto.eval)) if auto is not None else {}
    out = {}
    for d in record.dtypes:
        evals = dict(conditions(d.eval))
        error = (d.eval or {}).get("error")
        under = _under_load(d.kv_cache_dtype, evals, policy)
        if d.kv_cache_dtype == REFERENCE:
            out[d.kv_cache_dtype] = AccuracyVerdict(d.kv_cache_dtype, REFERENCE_STATE, under_load=under)
        elif error:
            out[d.kv_cache_dtype] = AccuracyVerdict(d.kv_cache_dtype, EVAL_FAILED, note=str(error)[:300])
        elif not evals:
            out[d.kv_cache_dtype] = AccuracyVerdict(
                d.kv_cache_dtype, NO_EVAL, note="not evaluated in this run, so its accuracy against auto is unknown"
            )
        elif not ref_evals:
            out[d.kv_cache_dtype] = AccuracyVerdict(
                d.kv_cache_dtype, NO_EVAL, note="auto was not evaluated, so there is nothing to compare with"
            )
        else:
            out[d.kv_cache_dtype] = _against_auto(d.kv_cache_dtype, evals, ref_evals, under, policy)
    return out


def _against_auto(dtype: str, evals: dict, ref_evals: dict, under: tuple, policy: Policy) -> AccuracyVerdict:
    pairs, gaps = [], []
    for cond, summary in evals.items():
        for task, entry in (summary.get("tasks") or {}).items():
            ref_summary = ref_evals.get(cond) or {}
            if _usable(entry.get("vs_auto")):
                pairs.append((task, cond, entry, (ref_summary.get("tasks") or {}).get(task), summary, ref_summary))
            elif task not in gaps:
                gaps.append(task)
    primary = _pooled(pairs, policy)
    tests = _tests(pairs, dtype, REFERENCE, policy, extra=primary)
    if not tests:
        return AccuracyVerdict(dtype, UNDECIDED, note="no paired 0/1 comparison with auto", gaps=tuple(gaps))
    if primary is not None:  # the pooled endpoint at rest as the run's looks decided it, where it took looks
        tests, primary = tests[:-1], tests[-1]
        rule = (evals.get("rest") or {}).get("sequential") if primary.conditions == ("rest",) else None
        primary = replace(primary, result=_sequential(rule, primary.result, primary.budget, policy.confidence))
    states = {t.result.verdict for t in tests}
    if primary is not None:
        lead = primary.result.verdict
        state = INFERIOR if INFERIOR in states or lead == INFERIOR else lead
    else:
        state = INFERIOR if INFERIOR in states else UNDECIDED if UNDECIDED in states or gaps else NON_INFERIOR
    return AccuracyVerdict(dtype, state, tests, under, gaps=tuple(gaps), primary=primary)


def _pooled(pairs: list[tuple], policy: Policy) -> Test | None:
    """The primary endpoint: every task's items in one condition (rest when there) pooled, as one table."""
    conds = [p[1] for p in pairs]
    if not conds:
        return None
    cond = "rest" if "rest" in conds else conds[0]
    rows = [p for p in pairs if p[1] == cond]
    if len(rows) < 2:  # one task: its own tests are the endpoint (intersection-union over its conditions)
        return None
    n = sum(p[2]["vs_auto"]["n"] for p in rows)
    losses = sum(p[2]["vs_auto"]["losses"] for p in rows)
    gains = sum(p[2]["vs_auto"]["gains"] for p in rows)
    tasks = tuple(p[0] for p in rows)
    budget = min(policy.margin(t) for t in tasks)  # the strictest budget of the tasks pooled
    paired = [paired_accuracy(p[2], p[3], p[2]["vs_auto"]) for p in rows]  # on the items both answered (N-P17)
    mine, theirs = [a for a, _ in paired], [b for _, b in paired]
    weights = [p[2]["vs_auto"]["n"] for p in rows]
    label = _label(cond, rows[0][4], rows[0][5], "", REFERENCE)
    return Test(
        task=f"pooled ({len(tasks)} task{'s' if len(tasks) != 1 else ''}, {n:,} items)",
        against=REFERENCE,
        conditions=(cond,),
        labels=(label,),
        merged=None,
        accuracy=_weighted(mine, weights),
        reference_accuracy=_weighted(theirs, weights),
        budget=budget,
        result=_sequential(
            rows[0][4].get("sequential"),
            ni.decide([(losses, gains, n, budget / 100)], policy.confidence)[0],
            budget,
            policy.confidence,
        ),
        pooled=tasks,
    )


def _sequential(rule: dict | None, fixed: ni.Result, budget: float, confidence: float) -> ni.Result:
    """The pooled result under the run's group-sequential rule (kvbench.core.sequential), where the run took looks:
    the decision and boundary of its last look derived from the pooled counts, the stored plan's items and the
    policy's alpha and margin, never read from the record (K-B17, N-P16); else the fixed-size test."""
    from kvbench.core import sequential as seq

    looks = (rule or {}).get("looks") or []
    if not looks or looks[-1].get("items") != fixed.n:
        return fixed
    from scipy.stats import norm

    planned = tuple(rule["planned_items"])
    k = len(looks) - 1
    bound = blocks.boundaries(planned, 1 - confidence)[k]
    decision = seq.look(fixed.losses, fixed.gains, fixed.n, budget / 100, bound, k == len(planned) - 1)
    level = float(norm.cdf(bound))
    lower, upper = ni.bounds(fixed.losses, fixed.gains, fixed.n, level)
    verdict = decision if decision in (NON_INFERIOR, INFERIOR) else UNDECIDED
    return replace(fixed, verdict=verdict, lower=lower, upper=upper, alpha_used=1 - level)


def paired_accuracy(entry: dict, other: dict | None, vs: dict) -> tuple[float | None, float | None]:
    """(this side's, the other side's) accuracy on the items both answered: every item this side answered is
    paired (records/blocks.TaskEval), so the other side's is this side's + (losses - gains) / n, whatever the
    other side scored on items this side never saw (N-P17: auto's 500 items beside fp8's 200)."""
    n, correct = vs.get("n"), entry.get("correct")
    if n and correct is not None and entry.get("n") == n and entry.get("ci95") is not None:
        mine = correct / n
        return mine, mine + (vs["losses"] - vs["gains"]) / n
    return entry.get("accuracy"), (other or {}).get("accuracy") if (other or {}).get("n") == n else None


def _weighted(values: list, weights: list[int]) -> float | None:
    if any(v is None for v in values) or not sum(weights):
        return None
    return sum(v * w for v, w in zip(values, weights, strict=True)) / sum(weights)


def _under_load(dtype: str, evals: dict, policy: Policy) -> tuple[Test, ...]:
    rest = evals.get("rest") or {}
    pairs = [
        (task, cond, entry, (rest.get("tasks") or {}).get(task), summary, rest)
        for cond, summary in evals.items()
        if cond != "rest"
        for task, entry in (summary.get("tasks") or {}).items()
        if _usable(entry.get("vs_rest"))
    ]
    return _tests(pairs, dtype, "itself at rest", policy)


def _usable(vs: dict | None) -> bool:
    """A stored paired comparison with counts that can be true (not one that holds only a verdict string); the
    record's own check (records/blocks.Paired) refuses the rest first: this is the second guard (K-B13)."""
    if not vs or not all(
        isinstance(vs.get(k), int) and not isinstance(vs.get(k), bool) for k in ("n", "losses", "gains")
    ):
        return False
    return vs["n"] > 0 and vs["losses"] >= 0 and vs["gains"] >= 0 and vs["losses"] + vs["gains"] <= vs["n"]


def _p(p: float) -> str:
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def degenerate_excess(dtype_eval: dict | None, auto_eval: dict | None, alpha: float) -> str | None:
    """Where a dtype's answers were degenerate more often than auto's in the same condition (Fisher's exact
    test, one-sided, Holm over the conditions), what it says; None otherwise."""
    from scipy.stats import fisher_exact

    rows = []
    for cond, summary in (dtype_eval or {}).items():
        if not isinstance(summary, dict) or not isinstance((auto_eval or {}).get(cond), dict):
            continue
        mine, ref = summary.get("degenerate"), auto_eval[cond].get("degenerate")
        if not mine or not ref or not mine["n"] or not ref["n"]:
            continue
        if mine["degenerate"] * ref["n"] <= ref["degenerate"] * mine["n"]:  # not more often than auto
            continue
        table = [[x["degenerate"], x["n"] - x["degenerate"]] for x in (mine, ref)]
        rows.append((float(fisher_exact(table, alternative="greater").pvalue), cond, mine, ref))
    rows.sort()
    flagged = []
    for i, (p, cond, mine, ref) in enumerate(rows):  # Holm's step-down over the conditions tested
        if p > alpha / (len(rows) - i):
            break
        kinds = ", ".join(f"{mine[k]} {k}" for k in DEGENERATE_KINDS if mine.get(k))
        flagged.append(
            f"{CONDITIONS.get(cond, cond)} {mine['degenerate']} of {mine['n']} ({kinds}) vs auto's "
            f"{ref['degenerate']} of {ref['n']} (Fisher exact one-sided p = {p:.3g})"
        )
    return ("degenerate answers: " + "; ".join(flagged)) if flagged else None
