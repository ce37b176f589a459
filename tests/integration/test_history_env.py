"""One asv environment per machine, whatever the checkout's path (issue 36): asv names an `existing`
environment after its interpreter's absolute path, so kvbench files every result under one fixed name
(asvrun.stabilize). Two checkouts of one machine run the same benchmark into one series that `asv publish`
reads; no committed file carries a path; `kvbench history upgrade` renames older files; a damaged one is
refused in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT, kvbench_here

from kvbench.core.errors import UsageError
from kvbench.orchestration.asvrun import (
    AsvProject,
    asv_command,
    env_name,
    link_venv,
    result_file,
    stabilize,
    write_machine_file,
)
from kvbench.specs.tracked import STABLE_ENV, STABLE_PYTHON

BENCH = """
class Tiny:
    version = "1"
    params = [["a", "b"]]
    param_names = ["kind"]

    def track_value(self, kind):
        return {"a": 1.0, "b": 2.0}[kind]

    track_value.unit = "s"
"""


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def checkout(path: Path, origin: Path | None = None) -> Path:
    if origin is None:
        path.mkdir(parents=True)
        git(path, "init", "-q", "-b", "main")
        git(path, "config", "user.email", "t@example.com")
        git(path, "config", "user.name", "t")
        conf = {k: v for k, v in json.loads((ROOT / "asv.conf.json").read_text()).items() if "regressions" not in k}
        (path / "asv.conf.json").write_text(json.dumps(conf))
        (path / "benchmarks").mkdir()
        (path / "benchmarks" / "__init__.py").write_text("")
        (path / "benchmarks" / "bench_tiny.py").write_text(BENCH)
        (path / ".gitignore").write_text(".asv/\nhtml/\n")
        git(path, "add", "-A")
        git(path, "commit", "-q", "-m", "first")
    else:
        subprocess.run(["git", "clone", "-q", str(origin), str(path)], check=True)
        git(path, "config", "user.email", "t@example.com")
        git(path, "config", "user.name", "t")
        git(path, "commit", "-q", "--allow-empty", "-m", "second")
    return path


def run_point(repo: Path, home: Path) -> Path:
    """`kvbench history run`'s asv step and filing, on this checkout's HEAD."""
    project = AsvProject.load(repo / "asv.conf.json")
    link_venv(project, Path(sys.prefix))
    sha = git(repo, "rev-parse", "HEAD")
    env = {**os.environ, "HOME": str(home)}
    out = subprocess.run(asv_command(project, sha, "cpu-x"), cwd=repo, env=env, capture_output=True, text=True)
    written = result_file(project.results_dir, "cpu-x", sha, env_name(project.env_python))
    assert written.is_file(), out.stdout[-2000:] + out.stderr[-2000:]
    return stabilize(written)


def test_two_checkouts_of_one_machine_feed_one_series_asv_publishes(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    write_machine_file({"machine": "cpu-x", "os": "Linux", "arch": "x86_64", "cpu": "c", "num_cpu": "2",
                        "ram": "1", "gpu": "none", "gpu_count": "0", "driver": "none", "cuda": "none"},
                       home / ".asv-machine.json")  # fmt: skip
    first = checkout(tmp_path / "ci-runner" / "kvbench")
    second = checkout(tmp_path / "second-clone", origin=first)
    points = [run_point(first, home), run_point(second, home)]
    assert {p.name.split("-", 1)[1] for p in points} == {f"{STABLE_ENV}.json"}
    for p in points:
        text = p.read_text()
        assert str(tmp_path) not in text and "ci-runner" not in text and "second-clone" not in text
        doc = json.loads(text)
        assert doc["env_name"] == STABLE_ENV and doc["python"] == doc["params"]["python"] == STABLE_PYTHON
    # the second checkout's point beside the first's (as a results branch or a merge carries it)
    (first / "results" / "cpu-x" / points[1].name).write_text(points[1].read_text())
    git(first, "pull", "-q", str(second), "main")
    out = subprocess.run([sys.executable, "-m", "asv", "publish"], cwd=first, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    graphs = [
        g for g in (first / "html" / "graphs").rglob("bench_tiny.Tiny.track_value.json") if "summary" not in g.parts
    ]
    assert len(graphs) == 1, graphs  # one series: the interpreter's path split it in two before
    series = json.loads(graphs[0].read_text())
    assert len(series) == 2 and [v for _, v in series] == [[1.0, 2.0], [1.0, 2.0]]


def test_history_upgrade_renames_path_named_results(tmp_path):
    results = tmp_path / "results"
    machine = results / "cpu-amd-epyc"
    machine.mkdir(parents=True)
    (machine / "machine.json").write_text(json.dumps({"machine": "cpu-amd-epyc", "version": 1}))
    old = "existing-py_home_runner_work_kvbench_.asv_venv_bin_python"
    doc = {"commit_hash": "7b14fea8" + "0" * 32, "env_name": old, "python": "/home/runner/x/python",
           "params": {"machine": "cpu-amd-epyc", "python": "/home/runner/x/python"}, "results": {"b": [[float("nan")]]},
           "version": 2}  # fmt: skip
    (machine / f"7b14fea8-{old}.json").write_text(json.dumps(doc))
    (machine / "0badf00d-existing-py_x.json").write_text("{truncated")
    shutil_conf(tmp_path)
    out = kvbench_here("history", "upgrade", "--config", str(tmp_path / "asv.conf.json"), "--json")
    assert out.returncode == 2 and "0badf00d" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    (machine / "0badf00d-existing-py_x.json").unlink()
    out = kvbench_here("history", "upgrade", "--config", str(tmp_path / "asv.conf.json"), "--json")
    assert out.returncode == 0, out.stderr
    (row,) = json.loads(out.stdout)
    new = machine / f"7b14fea8-{STABLE_ENV}.json"
    assert row["outcome"] == f"asv environment: renamed to {new.name}" and new.is_file()
    assert sorted(p.name for p in machine.iterdir()) == sorted(["machine.json", new.name])
    got = json.loads(new.read_text())
    assert got["env_name"] == STABLE_ENV and "/home/runner" not in new.read_text()
    assert got["results"] == {"b": [[None]]} or str(got["results"]["b"][0][0]) == "nan"  # nothing measured lost
    again = kvbench_here("history", "upgrade", "--config", str(tmp_path / "asv.conf.json"), "--json")
    assert again.returncode == 0 and json.loads(again.stdout) == []


def test_committed_results_carry_no_checkout_path():
    listed = subprocess.run(["git", "ls-files", "results"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    points = [n for n in listed if "-existing-" in n]
    if not points:
        pytest.skip("no committed asv history")
    assert all(n.endswith(f"-{STABLE_ENV}.json") for n in points), points
    for name in points:
        doc = json.loads((ROOT / name).read_text())
        assert doc["python"] == STABLE_PYTHON and doc["params"]["python"] == STABLE_PYTHON


def test_stabilize_refuses_a_damaged_result_in_one_line(tmp_path):
    bad = tmp_path / "abc-existing-py_x.json"
    bad.write_text("[1, 2")
    with pytest.raises(UsageError) as exc:
        stabilize(bad)
    assert "\n" not in str(exc.value) and bad.name in str(exc.value)


def shutil_conf(tmp_path: Path) -> None:
    (tmp_path / "asv.conf.json").write_text((ROOT / "asv.conf.json").read_text())


@pytest.mark.parametrize(
    "name,expected",
    [("existing-py_work_main_.asv_venv_bin_python", STABLE_ENV), (STABLE_ENV, STABLE_ENV), ("virtualenv-py3.11", None),
     (None, None), (3, None), ("", None)],
)  # fmt: skip
def test_one_env_files_every_existing_environment_as_one(name, expected):
    from kvbench.specs.tracked import one_env

    assert one_env(name) == (name if expected is None else expected)
