"""The verdict table (kvbench.analysis.verdict_table) and `kvbench report`'s verdict part: short without --explain."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvbench.analysis import verdict
from kvbench.analysis.verdict_table import COLUMNS, rows

RECORD = Path("results/cpu-amd-epyc/runs/20261202T105658Z-cpu-amd-epyc-4f374e.json")


def _record():
    from kvbench.records import read_record

    if not RECORD.is_file():
        pytest.skip(f"{RECORD} is not in this checkout")
    return read_record(RECORD)


def test_one_row_per_dtype_with_every_column_and_a_short_reason():
    rec = _record()
    got = {r.dtype: r for r in rows(rec, verdict.decide(rec))}
    assert set(got) == {"auto", "fp8", "nvfp4"} and all(len(r.cells()) == len(COLUMNS) for r in got.values())
    assert got["nvfp4"].speed == "emulated (not ranked)" and got["fp8"].capacity == "2.00x tokens"
    assert got["nvfp4"].accuracy.startswith("drop ") and "pooled, 600 items" in got["nvfp4"].accuracy
    assert all(len(r.reason) <= 90 for r in got.values())
    assert got["fp8"].kld == "—"  # no fidelity in this record


def test_fidelity_is_shown_per_condition_when_the_record_has_it():
    rec = _record()
    fid = {"rest": {"mean_kld": 0.0123, "mean_kld_ci": [0.01, 0.015], "top1_agreement": 0.97}}
    rec.dtype("nvfp4").fidelity = fid
    row = next(r for r in rows(rec, verdict.decide(rec)) if r.dtype == "nvfp4")
    assert row.kld == "rest 0.0123 [0.01, 0.015]" and row.agreement == "rest 97.0%"


def _report(explain: bool) -> list[str]:
    import json

    from kvbench.cli.commands.report_verdict import render_verdict_table
    from kvbench.core.output import console
    from kvbench.records import RunRecord

    rec = RunRecord.model_validate(json.loads(_record().model_dump_json()))
    with console.capture() as cap:
        render_verdict_table(rec, verdict.decide(rec), explain)
    return cap.get().splitlines()


def test_the_reports_verdict_part_is_at_most_40_lines_without_explain():
    lines = _report(explain=False)
    assert len(lines) <= 40, "\n".join(lines)
    assert any("--explain" in x for x in lines) and any(x.startswith("recommended: auto") for x in lines)


def test_report_explain_adds_the_long_statement(capsys):
    from kvbench.cli.commands.report import command

    command(None, record=RECORD, explain=True)  # ctx, then the flags
    out = capsys.readouterr().out
    assert "Task accuracy through lm-evaluation-harness" in out and "how: accuracy must be non-inferior" in out
    command(None, record=RECORD)
    assert "Task accuracy through lm-evaluation-harness" not in capsys.readouterr().out


def test_a_kld_indistinguishable_from_autos_floor_reads_no_measurable_change():
    rec = _record()
    floor = {"mean_kld": 0.001, "mean_kld_ci": [0.0005, 0.002], "top1_agreement": 0.99, "top1_agreement_ci": [0.98, 1]}
    rec.dtype("auto").fidelity = {"load": floor}
    same = {"mean_kld": 0.0015, "mean_kld_ci": [0.001, 0.003], "top1_agreement": 0.985, "top1_agreement_ci": [0.97, 1]}
    far = {"mean_kld": 0.2, "mean_kld_ci": [0.15, 0.25], "top1_agreement": 0.8, "top1_agreement_ci": [0.75, 0.85]}
    rec.dtype("fp8").fidelity = {"rest": same}
    rec.dtype("nvfp4").fidelity = {"rest": far}
    got = {r.dtype: r for r in rows(rec, verdict.decide(rec))}
    assert got["fp8"].kld.endswith("(no measurable change)") and "no measurable" not in got["nvfp4"].kld
    assert got["fp8"].verdict == "excluded (undecided)"  # informs; task accuracy still decides
