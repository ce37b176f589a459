"""A run of a real model from the registry (`kvbench run --model smollm2-135m-instruct`): the model prepared on
first use (kvbench/realmodels: its GGUF checked and converted, with progress), the run's defaults from
kvbench/data/realmodel_runs.toml on top of the backend's, and an SLO derived from the model and the box.

A CPU run of a real model cannot keep the tiny model's plan: its SLO (250 ms / 25 ms) is out of reach for a
135M-parameter model on 2 cores, and the tiny model's tasks (pseudo-English, 500 items each, six conditions)
would take hours. The plan here is sized to finish three dtypes in about half an hour on 2 cores: natural-text
retrieval with shared, cached haystacks, fidelity over at least 20,000 positions of natural text, one fixed load.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kvbench import realmodels
from kvbench.core.datafiles import load_toml

if TYPE_CHECKING:
    from kvbench.harness.run.runplan import RunPlan
    from kvbench.harness.run.settings import RunSettings

RUNS = "realmodel_runs.toml"
PLAN_ONLY = ("eval_conditions", "text_fidelity")  # RunPlan fields, not run_defaults.toml keys


@dataclass
class RealModelRun:
    """What a registry name changes in a run: the folder served, its name and provenance in the record, the
    settings with the model's defaults, and the plan's real-model fields."""

    settings: RunSettings
    name: str | None = None  # None: not a registry model (nothing changes)
    folder: Path | None = None
    provenance: dict | None = None
    eval_conditions: list[str] | None = None
    text_fidelity: dict | None = None
    notes: list[str] = field(default_factory=list)

    def finish(self, plan: RunPlan) -> RunPlan:
        """The plan of a registry model: its name in the record, its notes, eval conditions, natural-text fidelity
        and provenance; any other plan as it is."""
        if self.name is not None:
            plan.model_name = self.name
            plan.notes[:0] = self.notes
            plan.eval_conditions, plan.text_fidelity = self.eval_conditions, self.text_fidelity
            plan.model_provenance = self.provenance
        return plan


def build_plan(settings: RunSettings) -> RunPlan:
    """harness/run/defaults.py's build_plan, with a registry --model prepared and planned as a real model: what every
    caller (the run command, the asv suite, the nightly) plans with."""
    from kvbench.harness.run import defaults

    real = for_settings(settings)
    return real.finish(defaults.build_plan(real.settings))


class PrepareProgress(realmodels.Progress):
    """kvbench.realmodels.Progress on a rich Progress (stderr): one bar per step (MB hashed, tensors dequantized)."""

    def __init__(self, progress):
        self.progress, self.task = progress, None

    def step(self, text: str) -> None:
        if self.task is not None:
            self.progress.update(self.task, visible=False)
        if not self.progress.console.is_terminal:
            self.progress.console.print(text, highlight=False)
        self.task = self.progress.add_task(text, total=None)

    def advance(self, done: int, total: int) -> None:
        if self.task is not None:
            self.progress.update(self.task, completed=done, total=total)


def prepare_with_progress(name: str, root: Path | None = None, force: bool = False, quiet: bool = False) -> Path:
    """realmodels.prepare with its steps drawn on stderr (`kvbench models prepare`, and a run's first use)."""
    from kvbench.harness.run.progress import new_progress

    existing = realmodels.prepared_dir(name, root)
    progress = new_progress(disable=quiet or (existing is not None and not force))
    with progress:
        return realmodels.prepare(name, root, PrepareProgress(progress), force=force)


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def derived_slo(params_b: float, n_cores: int, prompt_tokens: int) -> tuple[dict[str, float], str]:
    """{ttft_p95_ms, tpot_p95_ms} for a model of `params_b` billion parameters on `n_cores` cores, and how it was
    derived: realmodel_runs.toml [slo]'s headroom x the reference latency scaled by parameters / cores."""
    ref = load_toml(RUNS)["slo"]
    scale = (params_b / ref["reference_params_b"]) * (ref["reference_cores"] / max(1, n_cores))
    ttft = ref["headroom"] * ref["prefill_ms_per_token"] * prompt_tokens * scale
    tpot = ref["headroom"] * ref["decode_ms_per_token"] * scale
    slo = {"ttft_p95_ms": float(f"{ttft:.3g}"), "tpot_p95_ms": float(f"{tpot:.3g}")}
    how = (
        f"SLO derived for {params_b:.3f} B parameters on {n_cores} cores: TTFT P95 <= {slo['ttft_p95_ms']:g} ms "
        f"({prompt_tokens} prompt tokens), TPOT P95 <= {slo['tpot_p95_ms']:g} ms ({ref['headroom']:g}x the unloaded "
        f"latency measured for SmolLM2-135M on {ref['reference_cores']} cores, scaled; kvbench/data/{RUNS})"
    )
    return slo, how


def for_settings(s: RunSettings) -> RealModelRun:
    """The real-model run `s` asks for, prepared; one that changes nothing unless --model names a registry model
    kvbench serves."""
    if s.endpoints is not None or not realmodels.is_registered(s.model):
        return RealModelRun(settings=s)
    name = s.model
    folder = prepare_with_progress(name, quiet=s.as_json)
    notes = [f"real model {name}: {folder}"]
    updates: dict = {"model": str(folder)}
    table = dict(load_toml(RUNS).get(name, {})) if not s.on_gpu else {}
    plan_fields = {k: table.pop(k) for k in PLAN_ONLY if k in table}
    if table:
        defaults = {**s.defaults, **table}
        from kvbench.specs.models import load_model

        prompt = s.prompt_tokens or defaults["prompt_tokens"]
        slo, how = derived_slo(load_model(name).param_count / 1e9, cores(), prompt)
        defaults.update(slo)
        notes.append(how)
        updates["defaults"] = defaults
        fixed = s.kv_cache_memory_bytes is None and not any(
            a.startswith("--kv-cache-memory") for a in s.extra_args or []
        )
        if fixed and "kv_cache_memory_bytes" in table:
            updates["kv_cache_memory_bytes"] = table["kv_cache_memory_bytes"]
    return RealModelRun(
        name=name,
        folder=folder,
        provenance=realmodels.provenance_of(folder),
        settings=s.model_copy(update=updates),
        notes=notes,
        **plan_fields,
    )
