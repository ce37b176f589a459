"""The nightly estimate raised to what a run of the same plan measured (kvbench.orchestration.nightly.measured): a
record with a known wall time makes the entry's estimate at least that, and the budget check and the shards use it;
without a matching record the model's figure stands and the note says so; a record of another model, other tasks, other
dtypes, an interrupted run or another kind of machine is not used. Every record here is written to tmp_path, so
nothing depends on which records are committed."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from support import shipped

from kvbench.core.datafiles import load_toml
from kvbench.core.tinyconfig import NAME as TINY_NAME
from kvbench.orchestration.nightly import config as nconfig
from kvbench.orchestration.nightly import estimate as nestimate
from kvbench.orchestration.nightly import matrix as nmatrix
from kvbench.orchestration.nightly import measured as nmeasured
from kvbench.orchestration.nightly import shards as nshards

REAL = "smollm2-135m-instruct"
REAL_ENTRY = f"{REAL}/{nmatrix.REAL_MODEL_PLAN}"
START = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)


def cpu_plan(**changes):
    cfg = nconfig.parse(shipped(**{"history.enabled": False, **changes}))
    return cfg, nmatrix.expand(cfg, "cpu")


def real_config(**changes) -> dict:
    """A real-model run's `config`, as its record holds it (the plan of kvbench/data/realmodel_runs.toml)."""
    own = load_toml("realmodel_runs.toml")[REAL]
    config = {
        "model_name": REAL,
        "kv_dtypes": ["auto", "fp8", "nvfp4"],
        "eval": {"tasks": list(own["eval_tasks"]), "limit": own["eval_limit"]},
        "text_fidelity": dict(own["text_fidelity"]),
    }
    config.update(changes)
    return config


def write_record(results, machine, minutes, config, status="complete", start=START, run_id=None) -> str:
    run_id = run_id or f"{start:%Y%m%dT%H%M%SZ}-{machine}-{int(minutes * 10):06x}"
    runs = results / machine / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    doc = {
        "run_id": run_id,
        "status": status,
        "created_at": start.isoformat(),
        "finished_at": (start + timedelta(minutes=minutes)).isoformat(),
        "config": config,
    }
    (runs / f"{run_id}.json").write_text(json.dumps(doc))
    return run_id


def entry(est, name):
    return next(x for x in est.entries if x.name == name)


def test_a_record_of_the_same_plan_raises_the_estimate_to_its_wall_time_and_the_budget_uses_it(tmp_path):
    cfg, plan = cpu_plan()
    modelled = entry(nestimate.estimate_machine(cfg, plan, results=tmp_path), REAL_ENTRY).total_s
    # longer than the model says, and than the whole night's budget: the check must see it
    minutes = cfg.machines["cpu"].max_minutes + 7.5
    run_id = write_record(tmp_path, "cpu-some-epyc", minutes, real_config())
    est = nestimate.estimate_machine(cfg, plan, results=tmp_path)
    x = entry(est, REAL_ENTRY)
    assert x.modelled_s == pytest.approx(modelled) and minutes * 60 > modelled
    assert x.total_s == pytest.approx(minutes * 60) and x.uses_measured and x.measured.run_id == run_id
    assert f"measured {minutes:.1f} min in run {run_id}" in x.basis() and x.basis() in x.notes
    assert est.minutes >= minutes and est.over_budget  # max_minutes is checked against the new figure
    unit = next(u for u in nshards.units(plan, est) if u.name == REAL_ENTRY)
    assert unit.minutes == pytest.approx(minutes)  # and the shards are dealt with it


def test_the_newest_matching_record_wins_and_a_shorter_one_leaves_the_model(tmp_path):
    cfg, plan = cpu_plan()
    write_record(tmp_path, "cpu-a", 500.0, real_config(), start=START)
    newer = write_record(tmp_path, "cpu-b", 0.5, real_config(), start=START + timedelta(days=1))
    x = entry(nestimate.estimate_machine(cfg, plan, results=tmp_path), REAL_ENTRY)
    assert x.measured.run_id == newer and not x.uses_measured  # any cpu-* folder, the newest record
    assert x.total_s == pytest.approx(x.modelled_s)
    assert f"modelled {x.modelled_s / 60:.1f} min used" in x.basis() and newer in x.basis()


def test_without_a_matching_record_the_model_stands_and_the_note_says_so(tmp_path):
    cfg, plan = cpu_plan()
    est = nestimate.estimate_machine(cfg, plan, results=tmp_path / "nothing-here")
    for x in est.entries:
        assert x.measured is None and x.total_s == pytest.approx(x.modelled_s)
        assert f"{x.name}: modelled {x.modelled_s / 60:.1f} min, modelled only: no committed run of this plan" in (
            x.notes
        )
    assert est.total_s == pytest.approx(sum(x.modelled_s for x in est.entries))


@pytest.mark.parametrize(
    "machine, config, status",
    [
        ("cpu-a", real_config(model_name="gemma-3-270m"), "complete"),  # another model
        ("cpu-a", real_config(kv_dtypes=["auto", "fp8"]), "complete"),  # other dtypes
        ("cpu-a", real_config(eval={"tasks": ["kvbench_textkey_2048"]}), "complete"),  # other tasks
        ("cpu-a", real_config(text_fidelity=None), "complete"),  # no natural-text fidelity
        ("cpu-a", real_config(), "interrupted"),  # stopped before its end
        ("cpu-a", real_config(), "failed"),
        ("h200-141gb", real_config(), "complete"),  # a GPU machine's record, for the CPU section
    ],
)
def test_a_record_of_another_plan_or_machine_or_an_unfinished_run_is_not_used(tmp_path, machine, config, status):
    cfg, plan = cpu_plan()
    write_record(tmp_path, machine, 10_000.0, config, status=status)
    est = nestimate.estimate_machine(cfg, plan, results=tmp_path)
    x = entry(est, REAL_ENTRY)
    assert x.measured is None and x.total_s == pytest.approx(x.modelled_s)
    assert "modelled only: no committed run of this plan" in x.basis()
    assert not est.over_budget


def test_the_atlas_matches_a_record_of_every_dtype_with_its_scales_variants_and_the_tiny_model_by_its_name(tmp_path):
    cfg, plan = cpu_plan(**{"machines.cpu.real_models": []})
    atlas = next(e for e in plan.entries if e.atlas)
    menu = [d.dtype for d in nestimate.estimate_entry(atlas, plan).dtypes]  # `all`, expanded
    tasks = [t for t in nestimate.backend_defaults(False)["eval_tasks"] if nmeasured._fits(t, atlas.context)]
    assert tasks  # the atlas's context holds the CPU default's tasks
    config = {
        "model_name": TINY_NAME,
        "kv_dtypes": [*menu, *(f"{d}@calibrated" for d in menu[:3])],
        "eval": {"tasks": tasks},
        "text_fidelity": None,
    }
    run_id = write_record(tmp_path, "cpu-x", 400.0, config, status="partial")  # partial: some dtype refused
    write_record(tmp_path, "cpu-x", 300.0, {**config, "kv_dtypes": menu[:-1]}, start=START + timedelta(days=2))
    x = entry(nestimate.estimate_machine(cfg, plan, results=tmp_path), atlas.name)
    assert x.measured.run_id == run_id and x.total_s == pytest.approx(400 * 60)


def test_a_gpu_section_reads_only_its_own_folder(tmp_path):
    cfg = nconfig.parse(shipped(**{"history.enabled": False}))
    plan = nmatrix.expand(cfg, "h200")
    e = plan.entries[0]
    config = {"model_name": e.model.name, "kv_dtypes": list(e.kv_dtypes), "eval": None, "text_fidelity": None}
    write_record(tmp_path, "cpu-a", 5_000.0, config)
    assert entry(nestimate.estimate_machine(cfg, plan, results=tmp_path), e.name).measured is None
    run_id = write_record(tmp_path, nmatrix.machine_folder(plan), 5_000.0, config)
    x = entry(nestimate.estimate_machine(cfg, plan, results=tmp_path), e.name)
    assert x.measured.run_id == run_id and x.total_s == pytest.approx(5_000 * 60)
