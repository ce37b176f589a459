"""A machine name becomes a folder under --results and part of every run id (issue 36): a user-given one that is
not one safe path component is refused in one line before anything runs; a derived one is made safe; and every
file a run writes lies inside the folder the user named."""

from __future__ import annotations

import pytest
from support import LEAN, json_summary, kvbench_at, one_line_error

from kvbench import records
from kvbench.core.errors import UsageError
from kvbench.records.layout import eval_path
from kvbench.specs.machine import MAX_NAME, check_machine_name, machine_name, safe_machine_name
from kvbench.testing.fakeserver import FakeConfig, FakeServer

HOSTILE = ["../../escaped", "..", ".", "a/b", "/abs", "x\ny", "a b", "é", "x" * (MAX_NAME + 1), "", "~root", "a\\b"]


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_names_are_refused_in_one_line(name):
    with pytest.raises(UsageError) as exc:
        check_machine_name(name, "KVBENCH_MACHINE")
    text = str(exc.value)
    assert "\n" not in text and "KVBENCH_MACHINE" in text and "letters, digits" in text


@pytest.mark.parametrize("name", ["h100-sxm-80gb", "8x-b200-180gb", "cpu-amd-epyc", "node_07.rack-3", "x" * MAX_NAME])
def test_safe_names_pass_unchanged(name):
    assert check_machine_name(name) == name


@pytest.mark.parametrize("text", ["../../escaped", "NVIDIA GH200 480GB/../x", "cpu-" + "z" * 300, "..", "...", "a\0b"])
def test_derived_names_are_made_safe(text):
    name = safe_machine_name(text)
    assert check_machine_name(name) == name


def test_environment_override_is_checked(monkeypatch):
    monkeypatch.setenv("KVBENCH_MACHINE", "../../escaped")
    with pytest.raises(UsageError):
        machine_name()
    monkeypatch.setenv("KVBENCH_MACHINE", "my-box")
    assert machine_name() == "my-box"


def test_paths_built_from_a_hostile_name_are_refused(tmp_path):
    for build in (
        lambda: records.record_path(tmp_path, "../../escaped", "r1"),
        lambda: records.record_path(tmp_path, "m", "../../../r1"),
        lambda: eval_path(tmp_path, "../x", "e1"),
        lambda: records.check_writable(tmp_path / "r", "../../escaped"),
    ):
        with pytest.raises(UsageError):
            build()
    assert not (tmp_path.parent / "escaped").exists()


@pytest.mark.parametrize("name", ["../../escaped", "a/b", ".."])
def test_an_endpoint_run_with_a_hostile_machine_is_refused_and_writes_nothing(tmp_path, tiny_model, name):
    results = tmp_path / "deep" / "results"
    with FakeServer(FakeConfig(max_model_len=512)) as srv:
        out = kvbench_at("run", f"auto={srv.base_url}", tiny_model, results, *LEAN, env={"KVBENCH_MACHINE": name})
    line = one_line_error(out)
    assert "KVBENCH_MACHINE" in line and "machine name" in line, line
    assert not any(p.is_file() for p in tmp_path.rglob("*")), sorted(tmp_path.rglob("*"))


def test_every_file_a_run_writes_lies_inside_results(tmp_path, tiny_model):
    results = tmp_path / "deep" / "results"
    with FakeServer(FakeConfig(max_model_len=512)) as srv:
        out = kvbench_at(
            "run", f"auto={srv.base_url}", tiny_model, results, *LEAN, "--num-requests", "4",
            env={"KVBENCH_MACHINE": "node_07.rack-3"},
        )  # fmt: skip
    json_summary(out)
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert written
    root = results.resolve()
    for p in written:
        assert p.resolve().is_relative_to(root / "node_07.rack-3"), p
    (rec,) = records.find_records(results)
    assert records.load_record(rec)["run_id"].split("-", 1)[1].startswith("node_07.rack-3-")


def test_compare_refuses_a_machine_that_is_a_path(tmp_path):
    from support import kvbench_here

    (tmp_path / "results").mkdir()
    out = kvbench_here("compare", "0.31.0", "0.32.0", "--machine", "../../etc", "--results", str(tmp_path / "results"))
    line = one_line_error(out)
    assert "--machine" in line and "letters, digits" in line, line
