"""Items until decided, inside a run: more of kvbench's generated items at rest while a dtype's pooled
accuracy comparison with auto is undecided (the stopping rule itself is kvbench.core.sequential's).

The looks are planned before any answer is seen: the first at --eval-limit items of each task, then equal
stages up to --max-eval-items (at most kvbench.core.sequential.MAX_LOOKS looks). Auto at rest answers every planned
item once (the reference a later stage pairs with); a candidate answers the next stage only while its pooled
comparison neither crossed its boundary nor needs, at the fixed-size test's 80% power, more items than the cap
holds (stopping for futility spends no alpha). Every look is kept in the record, under the rest condition's
`sequential`. lm-eval's own tasks have a fixed size: they use their items as given and take no looks.
"""

from __future__ import annotations

from dataclasses import replace

from kvbench.core import noninferiority as ni
from kvbench.core import sequential as seq


def pooled_counts(ref: dict, mine: dict, per_task: int) -> tuple[int, int, int]:
    """(losses, gains, n) over every task's first `per_task` items answered by both (doc ids below it)."""
    losses = gains = n = 0
    for task, theirs in ref.items():
        ours = mine.get(task, {})
        for doc in (d for d in theirs if d < per_task and d in ours):
            r, c = int(theirs[doc]), int(ours[doc])
            losses += r > c
            gains += c > r
            n += 1
    return losses, gains, n


def margin_of(plan) -> float:
    """The pooled endpoint's budget as a fraction: the strictest of the tasks pooled
    (kvbench.analysis.verdict_accuracy)."""
    budgets = plan.accuracy_budgets or {}
    return min(budgets.get(t, plan.accuracy_budget_points) for t in plan.eval_tasks) / 100


def judge(counts: list[tuple[int, int, int]], looks: list[int], tasks: int, plan) -> tuple[list, str | None]:
    """The looks taken so far under the plan (pooled item counts = per-task looks x tasks), and why the
    comparison stops early without a decision (None: it may go on)."""
    margin, alpha = margin_of(plan), 1 - plan.accuracy_confidence
    taken = seq.run(counts, [n * tasks for n in looks], margin, alpha)
    last = taken[-1]
    if last.decision != "continue":
        return taken, None
    needed = ni.items_needed(last.losses, last.gains, last.items, margin, alpha)
    cap = looks[-1] * tasks
    if needed is None or needed > cap:
        why = "the observed drop equals the budget" if needed is None else f"about {needed:,} items would decide it"
        taken[-1] = replace(last, decision=ni.UNDECIDED)
        return taken, f"stopped for futility at look {len(taken)}: {why}, beyond the cap of {cap:,}"
    return taken, None


def record(looks: list[int], tasks: int, taken: list, stopped: str | None, plan) -> dict:
    """What the record keeps of the rule: the plan, the spending function, every look, the decision."""
    return {
        "rule": seq.SPENDING,
        "alpha": 1 - plan.accuracy_confidence,
        "margin_points": margin_of(plan) * 100,
        "planned_items_per_task": looks,
        "planned_items": [n * tasks for n in looks],
        "looks": [t.as_dict() for t in taken],
        "decision": taken[-1].decision,
        "stopped": stopped,
    }


def merge(a, b):
    """Two evaluations of the same tasks on disjoint items as one (kvbench.harness.quality.evaluation.EvalResult)."""
    tasks = {}
    for name, ta in a.tasks.items():
        tb = b.tasks.get(name)
        items = sorted([*ta.items, *(tb.items if tb else [])], key=lambda i: i.doc_id)
        scores = [i.score for i in items]
        tasks[name] = replace(ta, items=items, n=len(items), value=sum(scores) / len(scores) if scores else ta.value)
    return replace(a, tasks=tasks, limit=None, wall_s=a.wall_s + b.wall_s)
