"""kvbench.analysis.verdict on constructed run records: each accuracy verdict, ties, the eligibility rules, typed
findings, and cases the old gate (a point-estimate drop within the budget, no correction) got wrong."""

from __future__ import annotations

import pytest

from kvbench.analysis import verdict
from kvbench.records import parse_record
from kvbench.records.findings import FindingKind
from kvbench.records.repeats import interval

TASK = "kvbench_passkey_512"


def cond(correct: int, n: int = 500, losses: int = 0, gains: int = 0, conc: int = 1, fp: str | None = None, **kw):
    """One condition's summary, as harness/quality/underload.py stores it (vs auto when losses/gains are given)."""
    entry = {"metric": "exact_match,exact", "n": n, "correct": correct, "accuracy": correct / n}
    if fp:
        entry["scores_sha256"] = fp
    if kw.get("vs_auto", True) and (losses or gains or kw.get("paired")):
        entry["vs_auto"] = {"n": n, "losses": losses, "gains": gains, "difference": (gains - losses) / n}
    return {"concurrency": conc, "tasks": {kw.get("task", TASK): entry}}


def dtype(name: str, *, status="ok", ev=None, knee=None, missed=None, tps=None, repeats=None, **kw) -> dict:
    d = {"kv_cache_dtype": name, "status": status, "kv_dtype_confirmed": kw.get("confirmed", True), "capacity": {}}
    if kw.get("endpoint"):
        d["server"] = {"managed": False}
    if ev is not None:
        d["eval"] = ev
    if knee is not None:
        probes = [{"concurrency": knee, "met": knee > 0}] + ([{"concurrency": missed, "met": False}] if missed else [])
        d["capacity"]["measured"] = {"max_concurrency": knee, "capped": False, "cap": 64, "probes": probes}
    if tps is not None:
        summary = {"completed": 10, "output_throughput_tps": tps}
        d["phases"] = [{"name": "fixed", "kind": "fixed", "concurrency": 16, "summary": summary}]
        if kw.get("canaries"):
            d["phases"][0]["canaries"] = kw["canaries"]
    if repeats:
        d["fixed_stats"] = {"output_throughput_tps": interval(repeats)}
    if kw.get("emulated"):
        d["emulated"] = True
    return d


def record(*dtypes: dict, findings=(), budget=1.0, gpus=False):
    doc = {
        "schema": "kvbench.run/2",
        "run_id": "r",
        "created_at": "2026-12-01T00:00:00+00:00",
        "machine": "m",
        "config": {"eval": {"budget_points": budget, "budgets": {}, "confidence": 0.95}},
        "environment": {"gpus": [{"name": "H100"}] if gpus else []},
        "dtypes": list(dtypes),
        "findings": list(findings),
    }
    return parse_record(doc)


AUTO_EVAL = {"rest": cond(500)}


def line(decision, name: str) -> str:
    return next(x for x in decision.lines() if x.startswith(f"{name}:"))


# --- accuracy -------------------------------------------------------------------------------------------------


def test_a_small_drop_whose_bound_crosses_the_budget_is_undecided_not_within_budget():
    """The old gate called this 'accuracy within budget' and let fp8 win on capacity (2 of 500 items lost:
    a 0.4-point point estimate inside 1 point, McNemar p = 0.5)."""
    fp8 = dtype("fp8", ev={"rest": cond(498, losses=2)}, knee=33, missed=34, tps=2500)
    d = verdict.decide(record(dtype("auto", ev=AUTO_EVAL, knee=16, missed=17, tps=2400), fp8))
    assert d.dtypes["fp8"].accuracy.state == "undecided" and not d.dtypes["fp8"].eligible
    assert d.recommended == "auto"
    text = line(d, "fp8")
    assert "accuracy undecided" in text and "drop 0.4 points" in text and "bound 1.2 > budget 1.0" in text
    assert "items would decide it at 80% power" in text and "within budget" not in text


def test_no_drop_with_the_bound_inside_the_budget_is_non_inferior_and_can_win():
    fp8 = dtype("fp8", ev={"rest": cond(500, paired=True)}, knee=33, missed=34, tps=2500)
    d = verdict.decide(record(dtype("auto", ev=AUTO_EVAL, knee=16, missed=17, tps=2400), fp8))
    assert d.dtypes["fp8"].accuracy.state == "non-inferior" and d.recommended == "fp8"
    assert "bound 0.5 <= budget 1.0" in line(d, "fp8") and "SLO capacity fp8 33 vs auto 16" in d.why


def test_a_drop_beyond_the_budget_is_inferior_and_a_breach():
    fp8 = dtype("fp8", ev={"rest": cond(470, losses=30)}, knee=33, tps=2500)
    d = verdict.decide(record(dtype("auto", ev=AUTO_EVAL, knee=16, tps=2400), fp8))
    v = d.dtypes["fp8"]
    assert v.accuracy.state == "inferior" and v.breach and v.kind == FindingKind.ACCURACY
    assert d.as_dict()["gate"]["fp8"]["breach"] is True
    assert [f.kind for f in d.findings()] == [FindingKind.ACCURACY]


def test_a_significant_drop_inside_the_budget_is_non_inferior():
    """The old gate excluded any McNemar-significant drop, however small: a 0.5-point loss on 10,000 items
    (p < 0.001) is what a 1-point budget allows."""
    fp8 = dtype("fp8", ev={"rest": cond(9950, n=10_000, losses=50)}, knee=33, tps=2500)
    d = verdict.decide(record(dtype("auto", ev={"rest": cond(10_000, n=10_000)}, knee=16, tps=2400), fp8))
    assert d.dtypes["fp8"].accuracy.state == "non-inferior" and d.recommended == "fp8"


def test_identical_conditions_are_one_test_printed_once_with_each_sides_concurrency():
    same = {"rest": (1, 1), "load": (33, 16), "during_load": (1, 1)}
    ev = {c: cond(498, losses=2, conc=k, fp="f") for c, (k, _) in same.items()}
    ev["during_load"]["traffic"] = {"mode": {"kind": "concurrency", "concurrency": 16}}
    auto = {c: cond(500, conc=a, fp="a") for c, (_, a) in same.items()}
    d = verdict.decide(record(dtype("auto", ev=auto), dtype("fp8", ev=ev)))
    tests = d.dtypes["fp8"].accuracy.tests
    assert len(tests) == 1 and tests[0].result.alpha_used == pytest.approx(0.05)  # Holm over 1 test, not 3
    text = line(d, "fp8")
    assert text.count("drop 0.4 points") == 1  # one task: no pooled endpoint beside it
    assert (
        "identical at rest (1 request at a time), at load (fp8 33 in flight, auto 16) and during load "
        "(1 at a time beside concurrency-16 traffic)" in text
    )


def test_different_answers_with_the_same_counts_are_separate_tests_and_need_no_holm_to_be_non_inferior():
    # 0 of 280 lost: non-inferior alone (p = 0.046), and on both: "non-inferior on every test" is an
    # intersection-union claim, each test at the full level (Berger 1982), not Holm's 0.025
    ev = {c: cond(280, n=280, paired=True, fp=f"f{i}") for i, c in enumerate(("rest", "load"))}
    auto = {c: cond(280, n=280, fp="a") for c in ("rest", "load")}
    alone = verdict.decide(record(dtype("auto", ev={"rest": auto["rest"]}), dtype("fp8", ev={"rest": ev["rest"]})))
    both = verdict.decide(record(dtype("auto", ev=auto), dtype("fp8", ev=ev)))
    assert alone.dtypes["fp8"].accuracy.state == "non-inferior"
    assert len(both.dtypes["fp8"].accuracy.tests) == 2 and both.dtypes["fp8"].accuracy.state == "non-inferior"
    assert all(t.result.alpha_used == pytest.approx(0.05) for t in both.dtypes["fp8"].accuracy.tests)


def test_a_dtype_without_evaluation_is_not_eligible_and_says_so():
    d = verdict.decide(record(dtype("auto", knee=16, tps=2400), dtype("fp8", knee=33, tps=4800)))
    assert d.recommended == "auto" and d.dtypes["fp8"].accuracy.state == "no eval"
    assert line(d, "fp8").startswith("fp8: excluded: no eval: not evaluated in this run")
    assert d.findings() == []  # not evaluating is the plan's choice, not a finding


def test_a_dtype_worse_under_load_than_at_rest_is_excluded():
    auto = {"rest": cond(500, fp="a"), "load": cond(500, conc=8, fp="a")}
    load = cond(440, losses=60, conc=8, fp="g")
    load["tasks"][TASK]["vs_rest"] = {"n": 500, "losses": 60, "gains": 0}
    ev = {"rest": cond(500, paired=True, fp="f"), "load": load}
    d = verdict.decide(record(dtype("auto", ev=auto), dtype("fp8", ev=ev)))
    assert not d.dtypes["fp8"].eligible and d.dtypes["fp8"].breach
    assert "at load (8 in flight on both)" in line(d, "fp8")


# --- speed: ties, noise ----------------------------------------------------------------------------------------


def test_a_throughput_difference_inside_its_repeat_ci_is_a_tie_never_a_win():
    both = {"rest": cond(500, paired=True)}
    auto = dtype("auto", ev=AUTO_EVAL, tps=2400, repeats=[2400, 1800, 3100])
    fp8 = dtype("fp8", ev=both, tps=2700, repeats=[2600, 2500, 3000])  # +267 tok/s mean, CI spans 0
    d = verdict.decide(record(auto, fp8))
    (c,) = d.contests
    assert c.winner == "tie" and "95% CI" in c.how and d.recommended == "auto"
    assert "tie with fp8" in d.why and "ties go to the more precise dtype" in d.why


def test_a_throughput_difference_beyond_its_repeat_ci_wins():
    auto = dtype("auto", ev=AUTO_EVAL, tps=2400, repeats=[2400, 2410, 2390])
    fp8 = dtype("fp8", ev={"rest": cond(500, paired=True)}, tps=2700, repeats=[2700, 2720, 2690])
    d = verdict.decide(record(auto, fp8))
    assert d.recommended == "fp8" and d.contests[0].winner == "fp8"


def test_unrepeated_throughput_within_the_noise_floor_is_a_tie():
    """A trace run's 669 vs 667 tokens/s (one replay each) once decided the recommendation."""
    auto = dtype("auto", ev=AUTO_EVAL, tps=667.0)
    fp8 = dtype("fp8", ev={"rest": cond(500, paired=True)}, tps=669.0)
    d = verdict.decide(record(auto, fp8))
    assert d.recommended == "auto" and d.contests[0].winner == "tie" and "noise floor" in d.contests[0].how


def test_capacity_within_the_probes_noise_is_a_tie_then_throughput_decides():
    auto = dtype("auto", ev=AUTO_EVAL, knee=16, missed=17, tps=1000)
    fp8 = dtype("fp8", ev={"rest": cond(500, paired=True)}, knee=18, missed=19, tps=2000)
    d = verdict.decide(record(auto, fp8))
    assert [c.winner for c in d.contests] == ["tie", "fp8"] and d.recommended == "fp8"


def test_cost_statements_carry_their_interval():
    from kvbench.analysis.verdict_speed import cost_lines

    rec = record(
        dtype("auto", tps=2805, repeats=[2460, 2599, 3358]),
        dtype("fp8", tps=2546, repeats=[2573, 2593, 2470]),
    )
    rec.comparisons = [
        {
            "kv_cache_dtype": "fp8",
            "cost": {
                "at_slo": {
                    "usd_per_m_output": 0.005814,
                    "auto_usd_per_m_output": 0.011557,
                    "saving_pct": 49.69,
                    "throughput_gain_pct": 98.78,
                }
            },
        }
    ]
    (text,) = cost_lines(rec)
    assert "fp8 costs 49.7% less (saving interval +23%..+73%)" in text and "±43% (3 repeats)" in text


# --- eligibility ------------------------------------------------------------------------------------------------


def test_an_unconfirmed_dtype_is_excluded_with_its_reason():
    ni = {"rest": cond(500, paired=True)}
    unsaid = dtype("fp8", ev=ni, knee=33, tps=2500, confirmed=None, endpoint=True)
    other = dtype("nvfp4", ev=ni, knee=60, tps=2500, confirmed=False)
    d = verdict.decide(record(dtype("auto", ev=AUTO_EVAL, knee=16, tps=2400), unsaid, other))
    assert d.recommended == "auto"
    assert "unconfirmed: the server does not say which KV dtype it runs" in line(d, "fp8")
    assert "the server reported another KV dtype" in line(d, "nvfp4")
    assert d.dtypes["fp8"].kind == FindingKind.UNCONFIRMED and d.findings() == []  # its line says why


def test_an_emulated_dtype_is_never_ranked_on_speed():
    ni = {"rest": cond(500, paired=True)}
    emulated = dtype("nvfp4", ev=ni, knee=60, missed=61, tps=99_999, emulated=True)
    d = verdict.decide(record(dtype("auto", ev=AUTO_EVAL, knee=16, tps=2400), emulated))
    v = d.dtypes["nvfp4"]
    assert v.status == "not ranked" and d.recommended == "auto" and d.contests == []
    assert "emulated" in line(d, "nvfp4") and "accuracy non-inferior" in line(d, "nvfp4")
    assert [f.kind for f in d.findings()] == [FindingKind.EMULATED]


def test_not_honoured_is_read_from_the_kind_and_a_cpu_wait_warning_excludes_nothing():
    ni = {"rest": cond(500, paired=True)}
    findings = [
        {"level": "warning", "dtype": "nvfp4", "text": "x", "engine_ratio": 2.0, "format_ratio": 3.56},
        {"level": "warning", "dtype": "fp8", "text": "the load generator waited for a CPU 30% of phase fixed"},
    ]
    rec = record(
        dtype("auto", ev=AUTO_EVAL, knee=16, tps=2400),
        dtype("fp8", ev=ni, knee=33, tps=2500),
        dtype("nvfp4", ev=ni, knee=32, tps=2500),
        findings=findings,
    )
    assert [f.kind for f in rec.findings] == [FindingKind.NOT_HONOURED, FindingKind.STARVED_CLIENT]
    d = verdict.decide(rec)
    assert d.recommended == "fp8" and "probably not honoured" in line(d, "nvfp4")


def test_failed_unsupported_and_canaries():
    ni = {"rest": cond(500, paired=True)}
    canaries = {"sent": 20, "same": 10, "differ": 10, "failed": 0}
    rec = record(
        dtype("auto", ev=AUTO_EVAL, knee=16, tps=2400, canaries={"sent": 20, "same": 20, "differ": 0}),
        dtype("fp8", ev=ni, knee=33, tps=2500, canaries=canaries),
        dtype("fp8_e5m2", status="failed"),
        dtype("nvfp4", status="unsupported"),
    )
    d = verdict.decide(rec)
    assert d.recommended == "auto" and d.dtypes["fp8"].kind == FindingKind.CANARY and d.dtypes["fp8"].breach
    assert "Fisher exact one-sided" in line(d, "fp8")
    assert d.dtypes["fp8_e5m2"].kind == FindingKind.FAILED and d.dtypes["nvfp4"].kind == FindingKind.UNSUPPORTED


def test_legacy_findings_get_kinds_and_unknown_kinds_read_as_other():
    rec = record(
        dtype("auto"),
        findings=[
            {"level": "warning", "dtype": "fp8", "text": "fp8 excluded from the recommendation: accuracy: x"},
            {"level": "error", "text": "findings not derived: KeyError"},
            {"level": "warning", "text": "something new", "kind": "from-a-newer-kvbench"},
        ],
    )
    assert [f.kind for f in rec.findings] == [FindingKind.ACCURACY, FindingKind.ERROR, FindingKind.OTHER]


def test_each_line_says_each_reason_once():
    ni = {"rest": cond(500, paired=True)}
    findings = [{"level": "warning", "dtype": "nvfp4", "text": "x", "engine_ratio": 2.0, "format_ratio": 3.56}]
    d = verdict.decide(record(dtype("auto", ev=AUTO_EVAL), dtype("nvfp4", status="partial", ev=ni), findings=findings))
    text = line(d, "nvfp4")
    assert text.count("not honoured") == 1 and text.count("run partial") == 1


# --- through the harness's own summaries (what a run stores), without lm-eval ----------------------------------


def _result(scores: list[float], conc: int):
    from kvbench.harness.quality.evaluation import EvalResult, ItemResult, TaskResult

    items = [ItemResult(i, "h", "t", "r", "r", s) for i, s in enumerate(scores)]
    task = TaskResult(TASK, "exact_match,exact", sum(scores) / len(scores), len(scores), items)
    return EvalResult({TASK: task}, "http://x", "m", conc, None, "0", 1.0)


def test_a_runs_eval_blocks_merge_conditions_by_their_fingerprints():
    """harness/quality/underload.py's summaries and paired comparisons, as the runner builds them, into decide(): fp8
    loses the same 2 items in every condition (one test, 'identical'), nvfp4 the same count but other items at load."""
    from kvbench.harness.quality import underload as quality

    right = [1.0] * 500
    lose_2 = [0.0, 0.0] + [1.0] * 498
    other_2 = [1.0] * 498 + [0.0, 0.0]
    runs = {
        "auto": {"rest": right, "load": right, "during_load": right},
        "fp8": {"rest": lose_2, "load": lose_2, "during_load": lose_2},
        "nvfp4": {"rest": lose_2, "load": other_2, "during_load": lose_2},
    }
    evals, items = {}, {}
    for name, conds in runs.items():
        for c, scores in conds.items():
            res = _result(scores, 16 if c == "load" else 1)
            evals.setdefault(name, {})[c] = quality.condition_summary(res, res.num_concurrent)
            items[(name, c)] = quality.items_by_task(res)
    quality.compare_conditions(evals, items)
    d = verdict.decide(record(*(dtype(n, ev=e) for n, e in evals.items())))
    fp8, nvfp4 = d.dtypes["fp8"].accuracy.tests, d.dtypes["nvfp4"].accuracy.tests
    assert len(fp8) == 1 and fp8[0].merged == "identical" and fp8[0].conditions == ("rest", "load", "during_load")
    assert sorted(len(t.conditions) for t in nvfp4) == [1, 2]  # load's answers differ: its own test
    assert "identical at rest" in line(d, "fp8") and "same counts" not in line(d, "fp8")


# --- issue 32: intersection-union, the pooled primary endpoint ------------------------------------------------


def test_identical_answers_on_400_items_are_non_inferior_at_a_1_point_budget_on_every_test():
    """Six tests (3 tasks x 2 conditions), each 400 items, no discordant pair: each bound is 0.67 points at the
    full 95% (intersection-union). Holm on this side would have put each at 99.17% (bound 1.4: undecided)."""
    tasks = ("a", "b", "c")
    ev = {c: {"concurrency": 1, "tasks": {}} for c in ("rest", "load")}
    auto = {c: {"concurrency": 1, "tasks": {}} for c in ("rest", "load")}
    for i, c in enumerate(("rest", "load")):
        for t in tasks:
            ev[c]["tasks"].update(cond(360, n=400, paired=True, task=t, fp=f"f{t}{i}")["tasks"])
            auto[c]["tasks"].update(cond(360, n=400, task=t, fp=f"a{t}{i}")["tasks"])
    d = verdict.decide(record(dtype("auto", ev=auto), dtype("fp8", ev=ev)))
    a = d.dtypes["fp8"].accuracy
    assert a.state == "non-inferior" and d.dtypes["fp8"].eligible and len(a.tests) == 6
    assert all(t.result.verdict == "non-inferior" and -t.result.lower * 100 < 0.7 for t in a.tests)
    assert a.primary is not None and a.primary.result.n == 1200 and a.primary.result.verdict == "non-inferior"


def test_a_3_point_true_drop_on_1000_items_is_inferior_holm_adjusted():
    # 40 lost, 10 gained of 1,000 on each of two tasks: a 3-point drop; inferior on each task and pooled (Holm
    # over the two tasks and the pooled endpoint: the smallest p at 0.05 / 3)
    ev = {"rest": {"concurrency": 1, "tasks": {}}}
    auto = {"rest": {"concurrency": 1, "tasks": {}}}
    for t in ("a", "b"):
        ev["rest"]["tasks"].update(cond(770, n=1000, losses=40, gains=10, task=t)["tasks"])
        auto["rest"]["tasks"].update(cond(800, n=1000, task=t)["tasks"])
    d = verdict.decide(record(dtype("auto", ev=auto), dtype("nvfp4", ev=ev)))
    a = d.dtypes["nvfp4"].accuracy
    assert a.state == "inferior" and d.dtypes["nvfp4"].breach
    assert a.primary.result.verdict == "inferior" and all(t.result.verdict == "inferior" for t in a.tests)
    assert min(t.result.alpha_used for t in (*a.tests, a.primary)) == pytest.approx(0.05 / 3)


def test_the_pooled_endpoint_decides_where_each_task_alone_cannot_but_a_task_inferior_still_excludes():
    ev = {"rest": {"concurrency": 1, "tasks": {}}}
    auto = {"rest": {"concurrency": 1, "tasks": {}}}
    for t in ("a", "b", "c"):  # 150 items each, none lost: each alone bound 1.8 (undecided), pooled 450: 0.6
        ev["rest"]["tasks"].update(cond(150, n=150, paired=True, task=t)["tasks"])
        auto["rest"]["tasks"].update(cond(150, n=150, task=t)["tasks"])
    d = verdict.decide(record(dtype("auto", ev=auto), dtype("fp8", ev=ev)))
    a = d.dtypes["fp8"].accuracy
    assert {t.result.verdict for t in a.tests} == {"undecided"}
    assert a.primary.result.n == 450 and a.primary.result.verdict == "non-inferior" and a.state == "non-inferior"
    ev["rest"]["tasks"].update(cond(100, n=150, losses=50, task="c")["tasks"])  # one task far beyond the budget
    d = verdict.decide(record(dtype("auto", ev=auto), dtype("fp8", ev=ev)))
    assert d.dtypes["fp8"].accuracy.state == "inferior" and not d.dtypes["fp8"].eligible


def test_the_quality_block_records_every_comparison_with_its_looks_and_items():
    ev = {"rest": {"concurrency": 1, "tasks": {}}}
    auto = {"rest": {"concurrency": 1, "tasks": {}}}
    for t in ("a", "b"):
        ev["rest"]["tasks"].update(cond(150, n=150, paired=True, task=t)["tasks"])
        auto["rest"]["tasks"].update(cond(150, n=150, task=t)["tasks"])
    gate = verdict.decide(record(dtype("auto", ev=auto), dtype("fp8", ev=ev))).as_dict()["gate"]["fp8"]
    first, *rest = gate["comparisons"]
    assert first["endpoint"] == "primary (pooled)" and first["items"] == 300 and first["looks"] == 1
    assert first["tasks"] == ["a", "b"] and [c["task"] for c in rest] == ["a", "b"]


def test_free_running_agreement_is_said_as_such_beside_fidelitys_teacher_forced_top1():
    """The 8-prompt greedy comparison counts every position after the first differing token, so '33.6%' beside a
    teacher-forced top-1 of 99.3% is no contradiction: the line gives the per-token rate and names the other."""
    fp8 = dtype("fp8", ev={"rest": cond(400, losses=0, paired=True)})
    fp8["agreement"] = {"prompts": 8, "vs_auto": {"sequences": 8, "tokens": 256, "token_agreement": 0.336}}
    rec = record(dtype("auto", ev={"rest": cond(400)}), fp8)
    line = verdict.decide(rec).dtypes["fp8"].line()
    assert "free-running greedy outputs match auto's at 33.6% of positions" in line and "teacher-forced" not in line
    fp8["fidelity"] = {"rest": {"items": 600, "tokens": 5800, "mean_kld": 0.004, "top1_agreement": 0.993}}
    line = verdict.decide(record(dtype("auto", ev={"rest": cond(400)}), fp8)).dtypes["fp8"].line()
    assert "top token agrees with auto's 99.3% teacher-forced" in line
    assert "33.6% of positions: they part at the first differing token" in line
