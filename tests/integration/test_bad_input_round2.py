"""Hostile input, round two (issue 24): workloads that never end, damaged fronts, claims whose tolerance or
value is not a number, and a table of bad invocations that each get one line and exit 2 (or a stated warning),
never a traceback. In-process (kvbench.cli.app.main), so the table stays quick."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support import cli, committed_results, cpu_plan

from kvbench.analysis.verdict import decide
from kvbench.core.errors import UsageError
from kvbench.harness.run.defaults import build_plan
from kvbench.harness.run.settings import RunSettings

ROOT = Path(__file__).resolve().parents[2]
# a committed run record with fronts (cpu-amd-epyc, price key cpu)
FRONT_RECORD = committed_results() / "cpu-amd-epyc" / "runs" / "20261201T113924Z-cpu-amd-epyc-8a542b.json"


def one_line(capsys, *args: str, code: int = 2) -> str:
    status, _, err = cli(capsys, *args)
    lines = err.strip().splitlines()
    assert status == code and len(lines) == 1 and "Traceback" not in err, (status, err[-2000:])
    return lines[0]


def plan(tmp_path, model, workload: str, **kw):
    return build_plan(
        RunSettings.for_machine(
            False, model=str(model), workload=workload, results_dir=tmp_path / "r", machine="m", **kw
        )
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


# -- the POOR kinds: one line and exit 2, or a stated warning ---------------------------------------------------


def _binary(tmp_path: Path) -> Path:
    path = tmp_path / "binary.toml"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe" + bytes(range(256)))
    return path


def _broken_benchmarks(tmp_path: Path) -> Path:
    results = tmp_path / "results"
    shutil.copytree(committed_results(), results, ignore=shutil.ignore_patterns("logs", "peer", "runs"))
    (results / "benchmarks.json").write_text('{"broken": ')
    shutil.copy(ROOT / "asv.conf.json", tmp_path / "asv.conf.json")
    return results


BAD_INVOCATIONS = {
    # case: (arguments, what the one line says, the fake server's settings where the case needs one)
    "bad port": (["run", "--endpoint", "http://127.0.0.1:99999"], "invalid port", None),
    "bad port, labelled": (["run", "--endpoint", "auto=http://127.0.0.1:abc,fp8=http://h:1"], "invalid port", None),
    "binary --workloads": (["run", "--workloads", "{binary}", "--workload", "x"], "not UTF-8", None),
    "folder --workloads": (["run", "--workloads", "{tmp}", "--workload", "x"], "not a file", None),
    "report DIR": (["report", "{tmp}"], "is a folder", None),
    "dashboard --out under a file": (["dashboard", "--results", "{tmp}", "--out", "{file}/site"], "--out", None),
    "dashboard, mistyped --results": (
        ["dashboard", "--results", "{tmp}/resluts", "--out", "{tmp}/site"],
        "no such",
        None,
    ),
    "broken benchmarks.json": (
        ["regress", "--results", "{broken}", "--config", "{broken}/../asv.conf.json"],
        "benchmarks.json",
        None,
    ),
    "CR/LF in a header": (
        ["run", "--endpoint", "http://127.0.0.1:9", "--header", "X-A: b\r\nX-Evil: 1"],
        "--header",
        None,
    ),
    "CR/LF in a key": (
        ["run", "--endpoint", "http://127.0.0.1:9", "--api-key", "sk-abc\r\nX-Evil: 1"],
        "--api-key",
        None,
    ),
    "eval task typo": (
        ["eval", "--tasks", "gsm8kk", "--kv-dtypes", "auto", "--results", "{tmp}"],
        "did you mean",
        None,
    ),
    "nightly unknown key": (["nightly", "--config", "{nightly}", "--dry-run"], "did you mean", None),
    "trailing /v1": (["run", "--endpoint", "{url}/v1"], "drop the trailing /v1", {}),
    "a 10,000-character model root": (
        ["run", "--endpoint", "{url}"],
        "not a folder on this machine",
        {"model_root": "r" * 10_000},
    ),
    "a cache_dtype that is no dtype": (
        ["run", "--endpoint", "{url}"],
        "not a KV-cache dtype name",
        {"kv_cache_dtype": "[/bold]\x1b[31m" + "x" * 100},
    ),
}


@pytest.fixture
def files(tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    nightly = tmp_path / "nightly.toml"
    shipped = (ROOT / "kvbench" / "data" / "nightly.toml").read_text()
    nightly.write_text(shipped.replace('version = "nightly"', 'versoin = "nightly"', 1))
    return {
        "binary": _binary(tmp_path),
        "tmp": tmp_path,
        "file": a_file,
        "broken": _broken_benchmarks(tmp_path),
        "nightly": nightly,
    }


@pytest.mark.parametrize("case", list(BAD_INVOCATIONS), ids=list(BAD_INVOCATIONS))
def test_bad_invocations_are_one_line(capsys, files, case):
    from kvbench.testing.fakeserver import FakeConfig, FakeServer

    args, message, fake = BAD_INVOCATIONS[case]
    with FakeServer(FakeConfig(max_model_len=512, **(fake or {}))) as srv:
        line = one_line(capsys, *(a.format(url=srv.base_url, **files) for a in args))
    assert message in line, line
    assert "\r" not in line and "X-Evil: 1" not in line and "\x1b" not in line and len(line) < 3000


# -- the POOR kinds that are warnings, not refusals ---------------------------------------------------------------


def test_openai_api_key_in_the_shell_does_not_block_a_local_run(capsys, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-the-shell-0123")
    status, _, err = cli(capsys, "run", "--kv-dtypes", "auto", "--num-requests", "0")
    note, line = err.strip().splitlines()
    assert status == 2 and "--num-requests must be" in line  # the next thing wrong is named, not the key
    assert "OPENAI_API_KEY is set and not used" in note and "sk-from-the-shell" not in err


def test_a_null_version_is_unknown_not_none(monkeypatch):
    from kvbench.harness.client import http
    from kvbench.harness.server import endpoint

    monkeypatch.setattr(http, "get", lambda *a, **k: (200, b'{"version": null}'))
    assert endpoint._version("http://h:1", {}, 1.0) is None


def test_markup_and_escape_sequences_in_a_record_are_printed_as_text(tmp_path, capsys):
    doc = json.loads(FRONT_RECORD.read_text())
    doc["dtypes"][0]["warnings"] = ["a log said [/bold] and \x1b[31mred\x1b[0m"]
    doc["dtypes"][0]["log_tail"] = ["[/red] \x1b]0;title\x07 tail"]
    doc["findings"] = [{"level": "warning", "text": "[bold]not markup[/]"}]
    path = tmp_path / "markup.json"
    path.write_text(json.dumps(doc))
    status, out, err = cli(capsys, "report", path)
    assert status == 0, err
    assert "[/bold]" in out and "[bold]not markup[/]" in out and "\x1b" not in out


def test_output_lengths_the_context_cannot_hold_are_said(tmp_path, tiny_model):
    from kvbench.harness.workloads import build, parse_workload

    f = tmp_path / "big.jsonl"
    f.write_text('{"prompt_tokens": 8, "output_tokens": 1000000000}\n{"prompt_tokens": 8, "output_tokens": 16}\n')
    plan = build(parse_workload(f"jsonl:{f}"), str(tiny_model), max_model_len=512)
    assert any("more output tokens than max_model_len 512" in n and "1,000,000,000" in n for n in plan.notes)


def test_a_context_above_the_models_positions_is_refused(tmp_path, tiny_model):
    with pytest.raises(UsageError) as exc:
        plan(tmp_path, tiny_model, "fixed:prompt=64,output=16", max_model_len=100_000)
    assert "max_position_embeddings" in str(exc.value)


def test_a_damaged_evals_parquet_is_named_on_the_page_not_dropped(tmp_path):
    from kvbench.dashboards.data import differing_items

    doc = json.loads(FRONT_RECORD.read_text())
    path = tmp_path / "run.json"
    doc["samples"] = {"evals": "run.evals.parquet", "eval_rows": 3}
    path.write_text(json.dumps(doc))
    (tmp_path / "run.evals.parquet").write_bytes(b"PAR1 not really")
    items = differing_items(str(path), "fp8", "kvbench_passkey_512", "rest")
    assert items.empty and "unreadable" in items.attrs["problem"]


def test_no_usage_failed_requests_and_no_canaries_are_stated(tmp_path, tiny_model):
    import asyncio

    from kvbench.harness.run.runner import Runner
    from kvbench.testing.fakeserver import FakeConfig, FakeServer

    cfg = FakeConfig(
        kv_cache_dtype="auto", max_model_len=512, usage=False, fail_every=5, metrics_body="not prometheus{"
    )
    with FakeServer(cfg) as srv:
        p = cpu_plan(
            tmp_path,
            model=str(tiny_model),
            machine="m",
            endpoints={"auto": srv.base_url},
            concurrency=[2],
            num_requests=10,
        )
        p.agreement_prompts = p.canaries = 0
        doc = asyncio.run(Runner(p, decide=decide).run()).as_doc()
    d = doc["dtypes"][0]
    assert d["status"] == "ok" and any("/metrics unusable" in w for w in d["warnings"])  # not a failed dtype
    texts = " ".join(f["text"] for f in doc["findings"])
    assert "sent no usage" in texts and "fixed-load requests failed" in texts, texts
    assert "no canary sent" in doc["quality"]["gate"]["auto"]["line"]  # never "canaries clean" when none was sent
