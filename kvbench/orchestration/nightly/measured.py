"""What a committed run of the same plan took: the floor under an entry's modelled minutes.

The load-phase model (estimate.py) prices an entry's server starts and load phases; it does not see the eval,
fidelity, agreement, reference passes or per-variant server starts of a run that evaluates, which are most of such
a run on a CPU (the real model's plan: modelled 8 min, measured 28). So each entry looks for the newest committed
run record of the same plan, and the entry's estimate is max(modelled, measured).

Same plan, read from the record's `config`:
  * model: `model_name` is the entry's model (the tiny model's own name for `tiny`);
  * KV dtypes: the record's, less their `@scales` variants, are the entry's (`all`: vLLM's menu, as the estimate
    expands it), as a set;
  * eval: the record's `eval.tasks` are the tasks the entry's run plans (the entry's own, a real model's own plan's,
    else the backend default's that the entry's context holds), as a set, and natural-text fidelity
    (`text_fidelity`) is on in both or in neither.
Machine: any results/cpu-* folder for [machines.cpu]; the section's own results folder on a GPU.
Measured: finished_at - created_at of a record whose status is complete or partial (the run went to its end,
some dtype failed or was refused, as in the atlas); an interrupted or failed run says nothing about a whole one.
The workload's request count and eval limit are not compared: a record of the same plan at other counts still
says where its minutes go, and the figure is only ever raised by it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

USABLE = ("complete", "partial")


@dataclass(frozen=True)
class PlanKey:
    """What makes two runs the same plan, for the estimate."""

    model_name: str
    dtypes: frozenset[str]
    tasks: frozenset[str]
    text_fidelity: bool


@dataclass(frozen=True)
class Measured:
    """One committed record's wall time."""

    run_id: str
    seconds: float
    path: Path
    created_at: str

    @property
    def minutes(self) -> float:
        return self.seconds / 60


def committed_results() -> Path:
    """The results folder of the checkout kvbench runs from: its committed records."""
    return Path(__file__).resolve().parents[3] / "results"


def _fits(task: str, context: int | None) -> bool:
    from kvbench.specs import evaltasks

    return not task.startswith(evaltasks.PREFIX) or context is None or evaltasks.parse_task(task)[1] <= context


def entry_key(entry, on_gpu: bool, dtypes: list[str] | tuple[str, ...] | None = None) -> PlanKey:
    """The plan an entry's run will record. `dtypes`: the entry's KV dtypes with `all` expanded (the estimate's)."""
    from kvbench.core.datafiles import load_toml
    from kvbench.core.tinyconfig import NAME
    from kvbench.orchestration.nightly.config import TINY
    from kvbench.orchestration.nightly.matrix import REAL_MODEL_PLAN

    defaults = dict(load_toml("run_defaults.toml")["gpu" if on_gpu else "cpu"])
    text = False
    if entry.workload == REAL_MODEL_PLAN:  # its own plan (harness/run/realplan.py) on top of the backend's
        own = load_toml("realmodel_runs.toml").get(entry.model.name, {})
        defaults.update(own)
        text = bool(own.get("text_fidelity"))
        tasks = [t for t in defaults.get("eval_tasks", []) if _fits(t, entry.context)]
    elif entry.eval_tasks is not None:
        tasks = list(entry.eval_tasks)
    else:  # the backend default, less what the run's context cannot hold (harness/run/defaults.py)
        tasks = [t for t in defaults.get("eval_tasks", []) if _fits(t, entry.context)]
    return PlanKey(
        model_name=NAME if entry.model.name == TINY else entry.model.name,
        dtypes=frozenset(d.split("@", 1)[0] for d in (dtypes if dtypes is not None else entry.kv_dtypes)),
        tasks=frozenset(tasks),
        text_fidelity=text,
    )


def record_key(doc: dict) -> PlanKey | None:
    config = doc.get("config")
    if not isinstance(config, dict) or not isinstance(config.get("model_name"), str):
        return None
    dtypes = config.get("kv_dtypes") or []
    tasks = (config.get("eval") or {}).get("tasks") or []
    if not all(isinstance(d, str) for d in dtypes) or not all(isinstance(t, str) for t in tasks):
        return None
    return PlanKey(
        model_name=config["model_name"],
        dtypes=frozenset(d.split("@", 1)[0] for d in dtypes),
        tasks=frozenset(tasks),
        text_fidelity=bool(config.get("text_fidelity")),
    )


def wall_seconds(doc: dict) -> float | None:
    """finished_at - created_at of a run that went to its end (complete or partial), else None."""
    from kvbench.records.queries import wall_seconds as span  # one definition of a run's wall time

    return span(doc, USABLE)


def machine_dirs(results: Path, folder: str | None) -> list[Path]:
    """The machine folders of the section's kind: every cpu-* one (folder None), else that one folder."""
    if not results.is_dir():
        return []
    if folder is None:
        return sorted(p for p in results.iterdir() if p.is_dir() and p.name.startswith("cpu-"))
    return [results / folder] if (results / folder).is_dir() else []


def index(results: Path, folder: str | None) -> list[tuple[PlanKey, Measured]]:
    """Every usable record of the section's kind of machine, newest first."""
    found = []
    for machine in machine_dirs(results, folder):
        for path in (machine / "runs").glob("*.json"):
            if path.name.startswith("."):
                continue
            try:
                doc = json.loads(path.read_text())
            except (OSError, UnicodeDecodeError, ValueError):
                continue
            if not isinstance(doc, dict):
                continue
            key, seconds = record_key(doc), wall_seconds(doc)
            if key is None or seconds is None:
                continue
            run_id = str(doc.get("run_id") or path.stem)
            found.append((key, Measured(run_id, seconds, path, str(doc.get("created_at")))))
    return sorted(found, key=lambda f: (f[1].created_at, f[1].run_id), reverse=True)


def newest(key: PlanKey, records: list[tuple[PlanKey, Measured]]) -> Measured | None:
    """The newest record of exactly this plan (`records` newest first, as index returns them)."""
    return next((m for k, m in records if k == key), None)
