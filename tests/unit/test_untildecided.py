"""Items until decided inside a run (harness/quality/untildecided.py): the planned looks, the pooled pairing, the stop
for futility, merging stages, and the verdict reading the looks."""

from types import SimpleNamespace

from kvbench.core import noninferiority as ni
from kvbench.core import sequential as seq
from kvbench.harness.quality import untildecided as ud
from kvbench.harness.quality.evaluation import EvalResult, ItemResult, TaskResult

PLAN = SimpleNamespace(
    accuracy_budgets={}, accuracy_budget_points=1.0, eval_tasks=["a", "b", "c"], accuracy_confidence=0.95
)


def test_pooled_counts_pair_only_items_both_answered_below_the_look():
    ref = {"a": {0: 1, 1: 1, 2: 0, 3: 1}, "b": {0: 0, 1: 1}}
    mine = {"a": {0: 0, 1: 1, 2: 1}, "b": {0: 0, 1: 0}}
    assert ud.pooled_counts(ref, mine, 3) == (2, 1, 5)  # a: loss at 0, gain at 2; b: loss at 1
    assert ud.pooled_counts(ref, mine, 1) == (1, 0, 2)


def test_a_comparison_the_cap_cannot_decide_stops_for_futility_as_undecided():
    # 1 loss and 1 gain in 600 pooled items: non-inferiority at a 1-point budget needs far fewer items than
    # a tie at the budget would, but a 1-point drop observed needs more than any cap
    taken, stopped = ud.judge([(9, 3, 600)], [200, 300, 400, 500], 3, PLAN)
    assert taken[-1].decision == ni.UNDECIDED and "futility" in stopped


def test_an_overwhelming_drop_stops_inferior_at_the_first_look_and_the_record_keeps_every_look():
    taken, stopped = ud.judge([(90, 0, 600)], [200, 300, 400, 500], 3, PLAN)
    assert stopped is None and taken[-1].decision == ni.INFERIOR and len(taken) == 1
    rec = ud.record([200, 300, 400, 500], 3, taken, stopped, PLAN)
    assert rec["planned_items"] == [600, 900, 1200, 1500] and rec["looks"][0]["items"] == 600
    assert rec["decision"] == ni.INFERIOR and rec["rule"] == seq.SPENDING


def test_a_narrow_drop_continues_at_the_first_look_where_the_fixed_test_would_stop():
    # the fixed-size test calls this inferior at 600 items; O'Brien-Fleming's first boundary asks for more
    fixed = ni.decide([(22, 5, 600, 0.01)], 0.95)[0]
    assert fixed.verdict == ni.INFERIOR
    taken, stopped = ud.judge([(22, 5, 600)], [200, 300, 400, 500], 3, PLAN)
    assert taken[-1].decision == "continue" and stopped is None


def _result(docs: range, score) -> EvalResult:
    items = [ItemResult(d, "x", "1", "1", "1", float(score(d))) for d in docs]
    task = TaskResult("a", "exact_match,exact", 0.0, len(items), items)
    return EvalResult({"a": task}, "http://h", "m", 1, 2, "0.4", 1.5)


def test_stages_merge_into_one_evaluation_of_all_items():
    merged = ud.merge(_result(range(0, 2), lambda d: 1), _result(range(2, 4), lambda d: d % 2))
    t = merged.tasks["a"]
    assert [i.doc_id for i in t.items] == [0, 1, 2, 3] and t.n == 4 and t.value == 0.75 and merged.wall_s == 3.0


def test_the_verdict_reads_the_looks_where_the_run_took_them():
    from kvbench.analysis.verdict_accuracy import _sequential

    fixed = ni.decide([(22, 5, 600, 0.01)], 0.95)[0]
    taken, _ = ud.judge([(22, 5, 600)], [200, 300, 400, 500], 3, PLAN)
    rule = ud.record([200, 300, 400, 500], 3, taken, None, PLAN)
    # the run ended at this look (a damaged or older record): undecided at the look's boundary, not inferior
    out = _sequential({**rule, "looks": [{**rule["looks"][0], "decision": ni.UNDECIDED}]}, fixed, 1.0, 0.95)
    assert out.verdict == ni.UNDECIDED and out.alpha_used < 0.05
    assert _sequential(None, fixed, 1.0, 0.95) is fixed
    later = ni.decide([(33, 8, 900, 0.01)], 0.95)[0]
    assert _sequential(rule, later, 1.0, 0.95).verdict == ni.INFERIOR  # n differs: fixed
    # the stored words are never read (K-B17): a look edited to "non-inferior" decides nothing
    edited = {**rule, "looks": [{**rule["looks"][0], "decision": ni.NON_INFERIOR, "boundary": 0.0}]}
    assert _sequential(edited, fixed, 1.0, 0.95) == out
