"""kvbench/records/blocks.py on constructed blocks (issue 42): the looks are checked against what their counts,
the plan and the policy give; a dtype stopped after its eval is partial, not failed."""

from __future__ import annotations

import pytest

from kvbench.core import noninferiority as ni
from kvbench.core import sequential as seq
from kvbench.records import DtypeResult, measured_anything
from kvbench.records.blocks import Sequential, check_looks, recompute_looks

PLANNED = [200, 400, 600, 800]  # pooled items at each look (two tasks, looks of 100..400 per task)


def _rule(counts: list[tuple[int, int, int]], margin: float = 0.01, alpha: float = 0.05) -> dict:
    looks = seq.run(counts, PLANNED, margin, alpha)
    return {
        "rule": seq.SPENDING,
        "alpha": alpha,
        "margin_points": margin * 100,
        "planned_items": PLANNED,
        "looks": [lk.as_dict() for lk in looks],
        "decision": looks[-1].decision,
        "stopped": None,
    }


def test_honest_looks_pass_and_each_edit_is_named():
    rule = _rule([(0, 0, 200), (0, 0, 400), (0, 0, 600)])
    Sequential.model_validate(rule)
    assert check_looks(rule, (0, 0, 600), 0.01, 0.05) is None
    assert [d for _, _, d in recompute_looks(rule, 0.01, 0.05)] == [lk["decision"] for lk in rule["looks"]]
    edited = {**rule, "looks": [*rule["looks"][:-1], {**rule["looks"][-1], "decision": ni.INFERIOR}]}
    assert "decision: 'inferior' stored, but its counts give" in check_looks(edited, (0, 0, 600), 0.01, 0.05)
    assert "alpha: 0.05 stored" in check_looks(rule, (0, 0, 600), 0.01, 0.025)
    assert "margin_points: 1 stored" in check_looks(rule, (0, 0, 600), 0.02, 0.05)
    assert "are not the tasks' paired counts" in check_looks(rule, (5, 0, 600), 0.01, 0.05)
    early = {**rule, "looks": [{**rule["looks"][0], "losses": 0, "gains": 0, "items": 200, "decision": "continue"}]}
    early["looks"][0]["statistic"] = 9.0  # a statistic its counts do not give
    assert "statistic: 9 stored" in check_looks(early, (0, 0, 200), 0.01, 0.05)


@pytest.mark.parametrize(
    "change,said",
    [
        (lambda r: r["looks"].reverse(), "more than the 200 planned|not in increasing order"),
        (lambda r: r.update(planned_items=[400, 200, 600, 800]), "increasing counts"),
        (lambda r: r["looks"][0].update(items=250), "more than the 200 planned"),
        (lambda r: r.update(decision="non-inferior"), "is not the last look's"),
    ],
)
def test_a_block_out_of_shape_is_refused(change, said):
    rule = _rule([(0, 0, 200), (0, 0, 400)])
    change(rule)
    with pytest.raises(ValueError, match=said):
        Sequential.model_validate(rule)


def test_a_dtype_stopped_after_its_eval_kept_a_measurement():
    assert not measured_anything(DtypeResult(kv_cache_dtype="fp8"))
    assert not measured_anything(DtypeResult(kv_cache_dtype="fp8", eval={"error": "lm-eval died"}))
    rest = {"rest": {"concurrency": 1, "tasks": {"t": {"n": 5, "correct": 5, "accuracy": 1.0}}}}
    assert measured_anything(DtypeResult(kv_cache_dtype="fp8", eval=rest))
