"""The typed blocks of a run record that hold measured quality: each dtype's `eval` (task accuracy per
condition, the paired comparisons with auto and with itself at rest, the sequential looks) and `fidelity`
(KL per token against auto), with the invariants a real measurement cannot break.

A record stores them as plain JSON objects (every reader takes them as dicts); these pydantic models check
them when a record is read (records.schema.DtypeResult's validators) and the checks that need the whole record
(paired counts against auto's, the looks against the stored plan and policy) run from RunRecord's. A record
that breaks one is "damaged run record: <field>: <why>", never half-believed (issue 42, K-B13, K-B17, N-P4,
N-P11, N-P16): an edited `n`, `losses` or `gains`, a negative or NaN KLD, an agreement of 150%, reversed
intervals, a look whose decision its counts do not give, a boundary or alpha its plan does not give.

Fields a record written by an older kvbench lacks are optional; only what is there is checked.
"""

from __future__ import annotations

import hashlib
import json
from functools import cache
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

Count = Annotated[StrictInt, Field(ge=0)]
Positive = Annotated[StrictInt, Field(ge=1)]
Number = StrictFloat
NonNegative = Annotated[StrictFloat, Field(ge=0)]
Fraction = Annotated[StrictFloat, Field(ge=0, le=1)]
# A KL per token from float32 logprobs is at most ~104 nats (log of the smallest float32); float64 logprobs
# reach ~745. Anything above this bound did not come from two distributions.
MAX_KLD_NATS = 1000.0
TOLERANCE = 2e-6  # records keep floats to 6 decimals
LOOK_DECISIONS = ("non-inferior", "inferior", "undecided", "continue")


class _Block(BaseModel):
    # Unknown keys are kept (a newer kvbench may add some); known ones must have the right type and range.
    model_config = ConfigDict(extra="allow", allow_inf_nan=False, strict=False)


def _interval(values: list[float] | None, low: float, high: float, name: str) -> None:
    if values is None:
        return
    if len(values) != 2:
        raise ValueError(f"{name} must be [low, high], got {len(values)} values")
    lo, hi = values
    if lo > hi + TOLERANCE:
        raise ValueError(f"{name} [{lo:g}, {hi:g}] is reversed")
    if lo < low - TOLERANCE or hi > high + TOLERANCE:
        raise ValueError(f"{name} [{lo:g}, {hi:g}] leaves [{low:g}, {high:g}]")


class Paired(_Block):
    """A paired comparison on the items both sides answered (vs_auto, vs_rest): harness/evalrecord._paired."""

    n: Positive
    losses: Count | None = None  # items the other side got right and this one wrong
    gains: Count | None = None
    difference: Annotated[Number, Field(ge=-1, le=1)] | None = None  # (gains - losses) / n
    ci95: list[Number] | None = None
    p_value: Fraction | None = None
    significant: bool | None = None
    verdict: str | None = None
    detectable_drop: NonNegative | None = None

    @model_validator(mode="after")
    def _check(self):
        if self.losses is not None and self.gains is not None:
            if self.losses + self.gains > self.n:
                raise ValueError(f"losses + gains ({self.losses} + {self.gains}) exceed the {self.n} items paired")
            want = (self.gains - self.losses) / self.n
            if self.difference is not None and abs(self.difference - want) > 1e-5:
                raise ValueError(f"difference {self.difference:g} is not (gains - losses) / n = {want:g}")
        _interval(self.ci95, -1.0, 1.0, "ci95")
        return self


class TaskEval(_Block):
    """One task in one condition: harness/quality.condition_summary."""

    metric: str | None = None
    n: Count
    correct: Count | None = None
    accuracy: Fraction | None = None
    ci95: list[Number] | None = None
    scores_sha256: str | None = None  # checked against the evals Parquet where it is here (check_scores)
    vs_auto: Paired | None = None
    vs_rest: Paired | None = None

    @model_validator(mode="after")
    def _check(self):
        if self.correct is not None and self.correct > self.n:
            raise ValueError(f"correct {self.correct} exceeds n {self.n}")
        if self.ci95 is not None and self.accuracy is not None and self.correct is not None and self.n:
            # 0/1 scores (a Wilson interval is kept only for them): the accuracy is correct / n
            if abs(self.accuracy - self.correct / self.n) > 1e-5:
                raise ValueError(f"accuracy {self.accuracy:g} is not correct / n = {self.correct}/{self.n}")
        _interval(self.ci95, 0.0, 1.0, "ci95")
        for name in ("vs_auto", "vs_rest"):
            vs = getattr(self, name)
            if vs is not None and vs.n != self.n:  # every item this side answered, the other side answered too
                raise ValueError(f"{name}.n {vs.n} is not the {self.n} items this task answered")
        return self


class Degenerate(_Block):
    n: Count
    degenerate: Count

    @model_validator(mode="after")
    def _check(self):
        if self.degenerate > self.n:
            raise ValueError(f"degenerate {self.degenerate} exceeds n {self.n}")
        return self


class Look(_Block):
    """One look of the sequential rule (kvbench.core.sequential.Look)."""

    items: Positive
    losses: Count
    gains: Count
    statistic: Number
    boundary: Annotated[Number, Field(gt=0)]
    spent: Fraction | None = None
    decision: str

    @field_validator("decision")
    @classmethod
    def _decision(cls, value: str) -> str:
        if value not in LOOK_DECISIONS:
            raise ValueError(f"{value[:40]!r} is not a decision; one of {', '.join(LOOK_DECISIONS)}")
        return value

    @model_validator(mode="after")
    def _check(self):
        if self.losses + self.gains > self.items:
            raise ValueError(f"losses + gains ({self.losses} + {self.gains}) exceed the {self.items} items")
        return self


class Sequential(_Block):
    """The group-sequential rule at rest (harness/untildecided.record): its plan and every look taken."""

    rule: str | None = None
    alpha: Annotated[Number, Field(gt=0, lt=1)]
    margin_points: Annotated[Number, Field(gt=0, le=100)]
    planned_items_per_task: list[Positive] | None = None
    planned_items: list[Positive]
    looks: list[Look] = Field(min_length=1)
    decision: str | None = None
    stopped: str | None = None

    @model_validator(mode="after")
    def _check(self):
        from kvbench.core import sequential as seq

        planned = self.planned_items
        if not 1 <= len(planned) <= seq.MAX_LOOKS or any(b <= a for a, b in zip(planned, planned[1:], strict=False)):
            raise ValueError(f"planned_items {planned} must be 1 to {seq.MAX_LOOKS} increasing counts")
        if len(self.looks) > len(planned):
            raise ValueError(f"{len(self.looks)} looks for {len(planned)} planned")
        for k, lk in enumerate(self.looks):
            if lk.items > planned[k]:
                raise ValueError(f"looks.{k}: {lk.items} items, more than the {planned[k]} planned")
            if k and (lk.items <= self.looks[k - 1].items or lk.losses < self.looks[k - 1].losses):
                raise ValueError(f"looks.{k}: the looks are not in increasing order of items")
            if k and lk.gains < self.looks[k - 1].gains:
                raise ValueError(f"looks.{k}: fewer gains than the look before")
        if self.decision is not None and self.decision != self.looks[-1].decision:
            raise ValueError(f"decision {self.decision!r} is not the last look's ({self.looks[-1].decision!r})")
        return self


class Condition(_Block):
    """One condition's summary (rest, load, batched, mixed, prefix, during_load)."""

    concurrency: Positive | None = None
    wall_s: NonNegative | None = None
    tasks: dict[str, TaskEval] = Field(default_factory=dict)
    degenerate: Degenerate | None = None
    sequential: Sequential | None = None
    prefix_share: Fraction | None = None


class FidelityCondition(_Block):
    """One condition of fidelity per token (kvbench.core.fidelity_stats.summarize)."""

    items: Count | None = None
    tokens: Count | None = None
    method: str | None = None
    mean_kld: Annotated[Number, Field(ge=0, le=MAX_KLD_NATS)] | None = None
    mean_kld_ci: list[Number] | None = None
    p99_kld: Annotated[Number, Field(ge=0, le=MAX_KLD_NATS)] | None = None
    max_kld: Annotated[Number, Field(ge=0, le=MAX_KLD_NATS)] | None = None
    top1_agreement: Fraction | None = None
    top1_agreement_ci: list[Number] | None = None
    mean_dlogp: Number | None = None
    rms_dlogp: NonNegative | None = None
    mean_gold_dlogp: Number | None = None
    concurrency: Positive | None = None
    wall_s: NonNegative | None = None
    s_per_item: NonNegative | None = None
    dropped_positions: Count | None = None

    @model_validator(mode="after")
    def _check(self):
        if self.items is not None and self.tokens is not None and self.items > self.tokens:
            raise ValueError(f"{self.items} items but {self.tokens} tokens (each item scores at least one)")
        _interval(self.mean_kld_ci, 0.0, MAX_KLD_NATS, "mean_kld_ci")
        _interval(self.top1_agreement_ci, 0.0, 1.0, "top1_agreement_ci")
        if self.p99_kld is not None and self.max_kld is not None and self.p99_kld > self.max_kld + TOLERANCE:
            raise ValueError(f"p99_kld {self.p99_kld:g} exceeds max_kld {self.max_kld:g}")
        return self


def _damaged(exc: ValidationError) -> tuple[str, str]:
    """A nested model's first error as (path inside the block, why)."""
    err = exc.errors()[0]
    why = err["msg"].removeprefix("Value error, ")
    value = err.get("input")
    if err["type"] != "value_error" and not isinstance(value, (dict, list)):
        why += f" (got {repr(value)[:40]})"
    return ".".join(str(p) for p in err["loc"]), why


def check_eval(value: Any) -> Any:
    """A dtype's `eval` checked ({condition: summary}, and `error`); returned as it was."""
    if value is None:
        return value
    if not isinstance(value, dict):
        raise PydanticCustomError("damaged_block", "{detail}", {"detail": "must be an object of conditions"})
    for cond, summary in value.items():
        if cond == "error":
            if not isinstance(summary, str):
                raise PydanticCustomError("damaged_block", "{detail}", {"detail": "error: must be text"})
            continue
        try:
            Condition.model_validate(summary)
        except ValidationError as exc:
            raise _prefixed(cond, exc) from None
    return value


def check_fidelity(value: Any) -> Any:
    """A dtype's `fidelity` checked ({condition: summary}); returned as it was."""
    if value is None:
        return value
    if not isinstance(value, dict):
        raise PydanticCustomError("damaged_block", "{detail}", {"detail": "must be an object of conditions"})
    for cond, summary in value.items():
        try:
            FidelityCondition.model_validate(summary)
        except ValidationError as exc:
            raise _prefixed(cond, exc) from None
    return value


def _prefixed(cond: str, exc: ValidationError) -> PydanticCustomError:
    where, why = _damaged(exc)
    path = ".".join(filter(None, (cond, where)))
    return PydanticCustomError("damaged_block", "{detail}", {"detail": f"{path}: {why}"})


# -- checks that need the whole record ----------------------------------------------------------------------


def policy(config: dict | None, environment: dict | None) -> tuple[float, float, dict[str, float]]:
    """(confidence, budget in points, per-task budgets) a run was planned with; run_defaults.toml's for records
    that did not store them. The one reading of it: the verdict's Policy and the looks' check use this."""
    from kvbench.core.datafiles import load_toml

    ev = (config or {}).get("eval") or {}
    defaults = load_toml("run_defaults.toml")
    backend = defaults["gpu" if (environment or {}).get("gpus") else "cpu"]
    budget, confidence = ev.get("budget_points"), ev.get("confidence")
    return (
        float(defaults["run"]["accuracy_confidence"] if confidence is None else confidence),
        float(backend["accuracy_budget_points"] if budget is None else budget),
        {str(k): float(v) for k, v in (ev.get("budgets") or {}).items()},
    )


@cache
def boundaries(planned: tuple[int, ...], alpha: float) -> tuple[float, ...]:
    from kvbench.core import sequential as seq

    return tuple(seq.boundaries([n / planned[-1] for n in planned], alpha))


def recompute_looks(rule: dict, margin: float, alpha: float) -> list[tuple[float, float, str]]:
    """(statistic, boundary, decision) of each stored look, from its counts, the planned items and the policy's
    alpha and margin (fractions): what the rule decides, whatever the record says it decided."""
    from kvbench.core import noninferiority as ni
    from kvbench.core import sequential as seq

    planned = tuple(rule["planned_items"])
    bounds = boundaries(planned, alpha)
    out = []
    for k, lk in enumerate(rule["looks"]):
        last = k == len(planned) - 1
        decision = seq.look(lk["losses"], lk["gains"], lk["items"], margin, bounds[k], last)
        out.append((ni.score(lk["losses"], lk["gains"], lk["items"], -margin), bounds[k], decision))
    return out


def check_looks(rule: dict, pooled: tuple[int, int, int] | None, margin: float, alpha: float) -> str | None:
    """Why a stored sequential block disagrees with its own counts, plan and policy (None: it agrees)."""
    if abs(rule["alpha"] - alpha) > 1e-9:
        return f"alpha: {rule['alpha']:g} stored, the run's confidence gives {alpha:g}"
    if abs(rule["margin_points"] - margin * 100) > 1e-6:
        return f"margin_points: {rule['margin_points']:g} stored, the run's budget gives {margin * 100:g}"
    looks = rule["looks"]
    if pooled is not None and (looks[-1]["losses"], looks[-1]["gains"], looks[-1]["items"]) != pooled:
        last = looks[-1]
        return (
            f"looks.{len(looks) - 1}: losses, gains, items ({last['losses']}, {last['gains']}, {last['items']}) "
            f"are not the tasks' paired counts at rest ({pooled[0]}, {pooled[1]}, {pooled[2]})"
        )
    for k, (stat, bound, decision) in enumerate(recompute_looks(rule, margin, alpha)):
        stored = looks[k]
        if abs(stored["boundary"] - bound) > 1e-3 * max(1.0, bound):
            return f"looks.{k}.boundary: {stored['boundary']:g} stored, the plan and alpha give {bound:.4g}"
        if abs(stored["statistic"] - stat) > 1e-3 * max(1.0, abs(stat)):
            return f"looks.{k}.statistic: {stored['statistic']:g} stored, its counts give {stat:.4g}"
        final = k == len(looks) - 1
        # an early stop for futility (or an interrupted run) keeps "undecided" where the counts say "continue"
        agrees = stored["decision"] == decision or (
            final and decision == "continue" and stored["decision"] in ("undecided", "continue")
        )
        if not final and decision != "continue":
            return (
                f"looks.{k}: its counts give {decision!r} (statistic {stat:.3g}, boundary {bound:.3g}), "
                "yet more looks follow"
            )
        if not agrees:
            return (
                f"looks.{k}.decision: {stored['decision']!r} stored, but its counts give {decision!r} "
                f"(statistic {stat:.3g} against boundary {bound:.3g})"
            )
    return None


def _pooled_counts(summary: dict) -> tuple[int, int, int] | None:
    tasks = [t.get("vs_auto") for t in (summary.get("tasks") or {}).values()]
    if not tasks or any(not vs or vs.get("losses") is None or vs.get("gains") is None for vs in tasks):
        return None
    return sum(vs["losses"] for vs in tasks), sum(vs["gains"] for vs in tasks), sum(vs["n"] for vs in tasks)


def check_record(dtypes: list, config: dict | None, environment: dict | None) -> str | None:
    """The checks across dtypes: each paired n within auto's items for that task and condition, and every
    sequential block consistent with its counts, plan and the run's policy. Returns '<field>: <why>' or None."""
    auto = next((d for d in dtypes if d.kv_cache_dtype == "auto"), None)
    ref = auto.eval if auto is not None and isinstance(auto.eval, dict) else {}
    confidence, budget, budgets = policy(config, environment)
    for i, d in enumerate(dtypes):
        for cond, summary in (d.eval or {}).items():
            if cond == "error" or not isinstance(summary, dict):
                continue
            ref_tasks = (ref.get(cond) or {}).get("tasks") or {}
            for task, entry in (summary.get("tasks") or {}).items():
                vs, theirs = entry.get("vs_auto"), ref_tasks.get(task)
                if vs and theirs is not None and vs["n"] > theirs["n"]:
                    return (
                        f"dtypes.{i}.eval.{cond}.tasks.{task}.vs_auto.n: {vs['n']} paired items, more than the "
                        f"{theirs['n']} auto answered"
                    )
            rule = summary.get("sequential")
            if rule:
                tasks = list(summary.get("tasks") or {}) or list(((config or {}).get("eval") or {}).get("tasks") or [])
                margin = min((budgets.get(t, budget) for t in tasks), default=budget) / 100
                why = check_looks(rule, _pooled_counts(summary), margin, 1 - confidence)
                if why:
                    return f"dtypes.{i}.eval.{cond}.sequential.{why}"
    return None


def is_damage(err: dict) -> bool:
    """A pydantic error raised by these checks (its message is the whole '<path>: <why>')."""
    return err.get("type") == "damaged_block"


def fingerprint(items: dict[int, float]) -> str:
    """sha256 of a task's (doc id, score) pairs: equal exactly when two runs scored every item the same."""
    text = json.dumps(sorted((int(k), float(v)) for k, v in items.items()), separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def check_scores(dtypes: list, frame) -> str | None:
    """Each task summary's n, correct and `scores_sha256` against its items in the evals Parquet (`frame`:
    kv_cache_dtype, condition, task, doc_id, score): an edited summary or an edited Parquet is damage (N-P4)."""
    groups = {key: g for key, g in frame.groupby(["kv_cache_dtype", "condition", "task"], sort=False)}
    for i, d in enumerate(dtypes):
        for cond, summary in (d.eval or {}).items():
            if cond == "error" or not isinstance(summary, dict):
                continue
            for task, entry in (summary.get("tasks") or {}).items():
                rows = groups.get((d.kv_cache_dtype, cond, task))
                where = f"dtypes.{i}.eval.{cond}.tasks.{task}"
                if rows is None:
                    return f"{where}: none of its {entry['n']} items is in the evals Parquet"
                scores = dict(zip(rows.doc_id.tolist(), rows.score.tolist(), strict=True))
                if len(rows) != entry["n"] or len(scores) != len(rows):
                    return f"{where}.n: {entry['n']} stored, the evals Parquet holds {len(rows)} rows for it"
                if entry.get("scores_sha256") and fingerprint(scores) != entry["scores_sha256"]:
                    return f"{where}.scores_sha256: its items in the evals Parquet give another fingerprint"
                right = sum(1 for v in scores.values() if v >= 1.0)
                if entry.get("correct") is not None and right != entry["correct"]:
                    return f"{where}.correct: {entry['correct']} stored, its items score {right} right"
    return None
