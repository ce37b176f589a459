"""One recommendation everywhere: for every committed run record, the overview page built from it and
`kvbench report` name the same dtype and print each dtype's line (its reasons) exactly once."""

from __future__ import annotations

import html
import re
import shutil
from pathlib import Path

import pytest
from support import committed_results

from kvbench.analysis.verdict import decide
from kvbench.cli.commands.report import render
from kvbench.core.output import console
from kvbench.dashboards import data as site_data
from kvbench.dashboards import page_overview
from kvbench.records import find_records, load_record, read_record

REPO = Path(__file__).resolve().parents[2]
RECORDS = find_records(committed_results())  # what the repository ships, not what `make run` added
PICK = re.compile(r'class="pick">(?:Recommended: <span class="chip"[^>]*></span>([^<]+)</span>|(No dtype recommended))')


def _page_text(record: Path, tmp_path: Path) -> tuple[str | None, str]:
    """(recommended dtype, the page's text) of the overview built from this one record."""
    runs = tmp_path / "results" / "m" / "runs"
    runs.mkdir(parents=True)
    shutil.copy(record, runs / record.name)
    data = site_data.SiteData(results_dir=tmp_path / "results")
    site_data.load_runs(tmp_path / "results", data)
    body = page_overview.build(data).body
    (m,) = PICK.findall(body)
    text = html.unescape(re.sub(r"<[^>]+>", " ", body))
    return (html.unescape(m[0]) if m[0] else None), text


def _report_text(record: Path) -> str:
    width = console.width
    console.width = 100_000  # one line per dtype line, not wrapped
    try:
        with console.capture() as cap:
            render(load_record(record), record, explain=True)  # the long statement: every line
    finally:
        console.width = width
    return cap.get()


def test_every_committed_record_is_read():
    assert len(RECORDS) >= 10  # the check below must not pass on an empty folder


@pytest.mark.parametrize("record", RECORDS, ids=[p.stem for p in RECORDS])
def test_page_and_report_recommend_the_same_dtype_for_the_same_reasons(record, tmp_path):
    decision = decide(read_record(record))
    page_pick, page = _page_text(record, tmp_path)
    report = _report_text(record)
    assert page_pick == decision.recommended
    assert _count(report, decision.headline()) == 1
    for line in decision.lines():
        assert _count(page, line) == 1, line
        assert _count(report, line) == 1, line
    lines = decision.lines()
    for reason in {r.text for v in decision.dtypes.values() for r in v.reasons}:
        # each reason only in the lines that hold it (fp8 and its alias fp8_e4m3 share theirs; the emulated
        # note is one dtype's reason and another's note)
        held = sum(_count(line, reason) for line in lines)
        assert _count(page, reason) == held == _count(report, reason), reason


def _count(text: str, part: str) -> int:
    """Occurrences of `part` not inside a longer name: "float16: ..." is no second copy of "bfloat16: ..." (the
    atlas record holds both, with the same words after the name)."""
    return len(re.findall(r"(?<![\w@])" + re.escape(part), text))


def test_the_cpu_default_record_reads_undecided_with_its_condition_labels():
    """The committed CPU default (pass-key at rest, at load and during load, 500 items each): fp8 lost 2 items
    in every condition, a 0.4-point drop whose one-sided bound (1.2) crosses the 1-point budget."""
    path = next(p for p in RECORDS if p.name == "20261201T194317Z-cpu-intel-xeon-e63eea.json")
    d = decide(read_record(path))
    assert d.recommended == "auto"
    fp8 = next(line for line in d.lines() if line.startswith("fp8:"))
    assert fp8.count("drop 0.4 points") == 1 and "accuracy undecided" in fp8
    assert (
        "at load (fp8 33 in flight, auto 16)" in fp8
        and "during load (1 at a time beside concurrency-16 traffic)" in fp8
    )
