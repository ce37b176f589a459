"""The README's two commands in either order (issue 36): `make run` adds records to the checkout's results/
(a run record under results/<machine>/runs/, an accuracy record on a box without one), and `make test` must
still pass after it. On a temporary clone: README command 1 with the run stubbed by the fake server (the run
itself is what tests/e2e/test_run_vllm.py covers), then the fast-tier tests that read records, which must read
the committed ones and not what the run added."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from support import ROOT, kvbench

from kvbench import records
from kvbench.specs.machine import machine_name
from kvbench.testing.fakeserver import FakeConfig, FakeServer

# The fast-tier tests that read results/: the two that failed after `make run` (issue 36), and the files whose
# fixtures come from the committed records.
READERS = [
    "tests/integration/test_dashboard.py::test_workload_runs_are_named_by_their_workload_not_placeholder_lengths",
    "tests/integration/test_dashboard.py::test_every_page_has_its_plots",
    "tests/integration/test_json_output.py",
    "tests/unit/test_verdict_pages.py",
    "tests/unit/test_claims.py",
    "tests/unit/test_harness_parsing.py::test_committed_v2_records_are_summaries_small_enough_for_git",
]


def again_as(path, machine: str) -> None:
    """The run record at `path` (and its samples) as if `make run` had written it on `machine`, newest there."""
    doc = json.loads(path.read_text())
    run_id = doc["run_id"].replace(doc["machine"], machine)
    doc.update(machine=machine, run_id=run_id)
    runs = path.parents[2] / machine / "runs"
    (runs / f"{run_id}.json").write_text(json.dumps(doc))
    for sample in path.parent.glob(path.name.removesuffix(".json") + ".*.parquet"):
        shutil.copy(sample, runs / sample.name.replace(path.name.removesuffix(".json"), run_id))


@pytest.fixture
def clone(tmp_path):
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    dst = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(dst)], check=True, timeout=120)
    return dst


def test_make_run_then_the_record_reading_tests_pass(clone, tiny_model):
    machine = machine_name()
    with FakeServer(FakeConfig(max_model_len=512)) as srv:
        run = kvbench("run", "--endpoint", srv.base_url, "--model", str(tiny_model), "--no-sweep", "--repeat", "1",
                      "--no-eval", "--no-search", "--num-requests", "4", cwd=clone, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    claims = kvbench("claims", cwd=clone, timeout=300)
    assert claims.returncode in (0, 1), claims.stderr[-3000:]  # 1: a claim judged false, not a failure
    # `make run` on the other committed machines (the newest record of each is the run's) and on a box without
    # an accuracy record (its accuracy record beside the committed one)
    made = records.find_records(clone / "results" / machine)
    (path,) = [
        p
        for p in made
        if subprocess.run(["git", "ls-files", "--error-unmatch", p], cwd=clone, capture_output=True).returncode
    ]
    for other in {p.parent.parent.name for p in records.find_records(clone / "results")} - {machine}:
        again_as(path, other)
    accuracy = sorted((clone / "results").glob("*/accuracy/*.json"))[0]
    added = clone / "results" / "cpu-new-box" / "accuracy" / "20991231T000000Z.json"
    added.parent.mkdir(parents=True)
    shutil.copy(accuracy, added)
    new = subprocess.run(["git", "status", "--porcelain", "results"], cwd=clone, capture_output=True, text=True)
    assert f"results/{machine}/" in new.stdout, new.stdout  # the run did add to the clone's results/

    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *READERS],
        cwd=clone,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert tests.returncode == 0, tests.stdout[-4000:] + tests.stderr[-2000:]
