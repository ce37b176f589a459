"""Hostile input, round two (issue 24): workloads that never end, damaged fronts, claims whose tolerance or
value is not a number, and a table of bad invocations that each get one line and exit 2 (or a stated warning),
never a traceback. In-process (kvbench.cli.main), so the table stays quick."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvbench.cli import main
from kvbench.datafiles import load_toml
from kvbench.errors import UsageError
from kvbench.harness.defaults import build_plan

CPU = load_toml("run_defaults.toml")["cpu"]
ROOT = Path(__file__).resolve().parents[1]
# a committed run record with fronts (cpu-amd-epyc, price key cpu)
FRONT_RECORD = ROOT / "results" / "cpu-amd-epyc" / "runs" / "20261201T113924Z-cpu-amd-epyc-8a542b.json"


def cli(capsys, *args: str) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of the kvbench command line, in-process."""
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in args])
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def one_line(capsys, *args: str, code: int = 2) -> str:
    status, _, err = cli(capsys, *args)
    lines = err.strip().splitlines()
    assert status == code and len(lines) == 1 and "Traceback" not in err, (status, err[-2000:])
    return lines[0]


def plan(tmp_path, model, workload: str, **kw):
    return build_plan(
        CPU, on_gpu=False, model=str(model), workload=workload, results_dir=tmp_path / "r", machine="m", **kw
    )


# -- 7. unbounded workloads -------------------------------------------------------------------------------


def _trace(tmp_path: Path, stamps_ms: list[float]) -> Path:
    path = tmp_path / "trace.jsonl"
    rows = [{"timestamp": t, "input_length": 8, "output_length": 4, "hash_ids": [i]} for i, t in enumerate(stamps_ms)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_trace_that_would_wait_for_years_is_refused_at_plan_time(tmp_path, tiny_model):
    trace = _trace(tmp_path, [0, 1000, 1e12])
    with pytest.raises(UsageError) as exc:
        plan(tmp_path, tiny_model, f"trace:{trace}")
    assert "max_span" in str(exc.value) and "\n" not in str(exc.value) and not (tmp_path / "r").exists()


def test_a_traces_span_and_longest_idle_gap_are_said_and_the_bound_can_be_raised(tmp_path, tiny_model):
    trace = _trace(tmp_path, [0, 1000, 601_000])  # a ten-minute silence before the third request
    with pytest.raises(UsageError):
        plan(tmp_path, tiny_model, f"trace:{trace},max_span=300")
    notes = " ".join(plan(tmp_path, tiny_model, f"trace:{trace}").notes)
    assert "3 requests over 10.0 min" in notes and "longest idle gap 10.0 min (600 s) before request 3" in notes, notes


@pytest.mark.parametrize(
    "workload,message",
    [
        ("multi-turn:sessions=100000000,turns=2,user=8,reply=8", "sessions must be"),
        ("multi-turn:sessions=5000,turns=100,user=8,reply=8", "sessions x turns"),
    ],
)
def test_conversations_beyond_what_a_run_holds_are_refused(tmp_path, tiny_model, workload, message):
    with pytest.raises(UsageError) as exc:
        plan(tmp_path, tiny_model, workload)
    assert message in str(exc.value) and "\n" not in str(exc.value)


# -- 10. plan --from-run on damaged fronts -------------------------------------------------------------------


@pytest.mark.parametrize("value", [float("nan"), -5.0])
def test_plan_from_a_damaged_front_is_one_line(tmp_path, capsys, value):
    doc = json.loads(FRONT_RECORD.read_text())
    for d in doc["dtypes"]:
        for p in (d.get("front") or {}).get("points") or []:
            p["output_tps_per_gpu"] = value
    damaged = tmp_path / "damaged.json"
    damaged.write_text(json.dumps(doc))  # json writes NaN as the bare token NaN, which Python reads back
    line = one_line(capsys, "plan", "--from-run", damaged, "--users", "100")
    assert str(damaged) in line and "output_tps_per_gpu" in line


def test_plan_from_a_front_with_no_throughput_sizes_nothing(tmp_path, capsys):
    doc = json.loads(FRONT_RECORD.read_text())
    for d in doc["dtypes"]:
        front = d.get("front") or {}
        for p in [*(front.get("points") or []), front.get("at_slo") or {}]:
            if p:
                p["output_tps_per_gpu"] = 0.0
    zero = tmp_path / "zero.json"
    zero.write_text(json.dumps(doc))
    status, out, err = cli(capsys, "plan", "--from-run", zero, "--users", "100", "--json")
    rows = json.loads(out)["rows"]
    assert all(r["gpus"] is None for r in rows), rows  # never "100 GPUs" from a point that served nobody
    assert any("no output throughput" in r["why"] for r in rows)


# -- 11. claims whose numbers are not numbers ----------------------------------------------------------------

CLAIM = '[[claims]]\nid = "x"\ntext = "t"\nquantity = "users"\ndtype = "fp8"\nmodel = "llama-3.1-8b"\n'
CLAIM += "context = 8192\nkv_budget_gb = 40\n"


@pytest.mark.parametrize(
    "lines,message",
    [
        ("claimed = 100\ntolerance_pct = -5", "tolerance_pct must be a finite number >= 0"),
        ("claimed = 100\ntolerance_pct = inf", "tolerance_pct must be a finite number >= 0"),
        ("claimed = nan\ntolerance_pct = 5", "claimed must be a finite number"),
        ('claimed = "lots"\ntolerance_pct = 5', "claimed must be a finite number"),
        ("claimed = 100\ncontext = -1", "context must be a finite number > 0"),
    ],
)
def test_claims_numbers_are_checked_in_one_line(tmp_path, capsys, lines, message):
    f = tmp_path / "claims.toml"
    f.write_text(CLAIM.replace("context = 8192\n", "" if "context" in lines else "context = 8192\n") + lines + "\n")
    line = one_line(capsys, "claims", "--file", f, "--results", tmp_path / "none")
    assert message in line and str(f) in line
