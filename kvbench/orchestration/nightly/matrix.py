"""A machine section expanded into matrix entries: models x workloads x SLOs, with the per-GPU overrides
applied. One entry is one `kvbench run` (all its KV dtypes, one vLLM server each)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kvbench.core.errors import UsageError
from kvbench.orchestration.nightly.config import CPU, TINY, MachineConfig, NightlyConfig, WorkloadOverride, model_kind


@dataclass(frozen=True)
class ModelRef:
    name: str  # as the config says it
    serve: str | None  # what vLLM gets as --model (None: the tiny model, built on demand)
    spec: str | None  # what kvbench.specs.models.load_model reads for the capacity model (None: unknown)

    @property
    def label(self) -> str:
        return self.name.rsplit("/", 1)[-1] if model_kind(self.name) in ("hf", "path") else self.name


def resolve_model(name: str) -> ModelRef:
    from kvbench.specs.models import catalog

    kind = model_kind(name)
    if kind == "tiny":
        return ModelRef(name, None, None)  # its config is kvbench.core.tinyconfig.CONFIG
    if kind == "short":
        return ModelRef(name, catalog()[name]["hf_id"], name)
    if kind == "path":
        p = Path(name).expanduser()
        folder = p if p.is_dir() else p.parent
        return ModelRef(name, str(folder), str(p))
    return ModelRef(name, name, None)  # an HF id: vLLM fetches it; no local config.json


@dataclass(frozen=True)
class Entry:
    name: str  # model/workload/slo
    model: ModelRef
    workload: str
    prompt_tokens: int
    output_tokens: int
    num_requests: int
    concurrency: tuple[int, ...]
    api: str
    slo_name: str | None
    slo: dict | None  # {"ttft_p95_ms": .., "tpot_p95_ms": ..} when the entry searches; None: fixed load only
    kv_dtypes: tuple[str, ...]
    max_model_len: int | None
    search_cap: int | None
    extra_args: tuple[str, ...]
    notes: tuple[str, ...] = ()
    eval_tasks: tuple[str, ...] | None = None  # None: the backend default
    budget_points: float | None = None  # None: the backend default
    budgets: tuple[tuple[str, float], ...] = ()  # (task, points) for this entry's model
    workload_spec: str | None = None  # a --workload value; None: the fixed prompt/output lengths above
    atlas: bool = False  # the atlas entry (every KV dtype, fixed load only), with its eval limit and scales variants
    eval_limit: int | None = None
    kv_scales: tuple[str, ...] = ()

    @property
    def context(self) -> int:
        return self.max_model_len or self.prompt_tokens + self.output_tokens

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "model": self.model.name,
            "served_as": self.model.serve,
            "workload": self.workload,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "num_requests": self.num_requests,
            "concurrency": list(self.concurrency),
            "api": self.api,
            "slo": self.slo_name,
            "slo_bounds": self.slo,
            "kv_dtypes": list(self.kv_dtypes),
            "max_model_len": self.max_model_len,
            "search_cap": self.search_cap,
            "extra_args": list(self.extra_args),
            "notes": list(self.notes),
            "workload_spec": self.workload_spec,
            "atlas": self.atlas,
        }


@dataclass
class MachinePlan:
    key: str  # GPU catalog key or "cpu"
    cfg: MachineConfig
    vllm: str  # the vLLM version or channel this machine tests
    entries: list[Entry] = field(default_factory=list)

    @property
    def on_gpu(self) -> bool:
        return self.key != CPU

    @property
    def gpus(self) -> int:
        """GPUs paid for: the section's `gpus` (else its tensor-parallel size) on each of its nodes; 0 without a GPU."""
        return 0 if not self.on_gpu else (self.cfg.gpus or self.cfg.tensor_parallel_size) * self.cfg.nodes

    @property
    def serving_gpus(self) -> int:
        """GPUs one vLLM server spans: tensor parallel on each node x the nodes (pipeline stages)."""
        return self.cfg.tensor_parallel_size * self.cfg.nodes

    @property
    def history_model(self) -> ModelRef:
        return resolve_model(self.cfg.history_model or self.cfg.models[0])

    @property
    def gpu(self):
        from kvbench.specs.gpus import get_gpu

        return get_gpu(self.key) if self.on_gpu else None


def expand(cfg: NightlyConfig, key: str) -> MachinePlan:
    """The matrix of one machine section, in config order: models, then workloads, then SLOs."""
    if key not in cfg.machines:
        raise UsageError(f"the nightly config has no [machines.{key}] section; configured: {', '.join(cfg.machines)}")
    m = cfg.machines[key]
    plan = MachinePlan(key=key, cfg=m, vllm=m.vllm or cfg.vllm.version)
    extra = list(m.extra_args)
    if m.tensor_parallel_size > 1:
        extra += ["--tensor-parallel-size", str(m.tensor_parallel_size)]
    if m.nodes > 1:  # one pipeline stage per node, over the Ray cluster the SkyPilot task starts (vLLM's multi-node)
        extra += ["--pipeline-parallel-size", str(m.nodes), "--distributed-executor-backend", "ray"]
    for model_name in m.models:
        model = resolve_model(model_name)
        for wname in m.workloads:
            w = cfg.workloads[wname].model_dump()
            override = m.overrides.get(wname)
            if override is not None:
                w.update({k: v for k, v in override.model_dump().items() if v is not None})
            notes = []
            conc = list(dict.fromkeys(w["concurrency"]))
            if m.max_concurrency is not None and max(conc) > m.max_concurrency:
                notes.append(f"concurrency {conc} capped at max_concurrency {m.max_concurrency}")
                conc = list(dict.fromkeys(min(c, m.max_concurrency) for c in conc))
            if m.max_model_len is not None and w["prompt_tokens"] + w["output_tokens"] > m.max_model_len:
                raise UsageError(
                    f"[machines.{key}] workload {wname!r}: "
                    f"prompt + output tokens ({w['prompt_tokens'] + w['output_tokens']}) "
                    f"exceed max_model_len {m.max_model_len}"
                )
            for slo_name in m.slos or [None]:
                slo = None
                if slo_name is not None:
                    # both keys, None included: the plan fills absent keys from the backend default,
                    # and an SLO without a TPOT bound must stay without one
                    slo = cfg.slos[slo_name].model_dump()
                name = "/".join(p for p in (model.label, wname, slo_name or "fixed-load") if p)
                plan.entries.append(
                    Entry(
                        name=name,
                        model=model,
                        workload=wname,
                        prompt_tokens=w["prompt_tokens"],
                        output_tokens=w["output_tokens"],
                        num_requests=w["num_requests"],
                        concurrency=tuple(conc),
                        api=w["api"],
                        slo_name=slo_name,
                        slo=slo,
                        kv_dtypes=tuple(m.kv_dtypes),
                        max_model_len=m.max_model_len,
                        search_cap=m.max_concurrency if slo is not None else None,
                        extra_args=tuple(extra),
                        notes=tuple(notes),
                        eval_tasks=tuple(cfg.quality.eval_tasks) if cfg.quality.eval_tasks is not None else None,
                        budget_points=cfg.quality.budget_points,
                        budgets=tuple(
                            (k.split("/", 1)[1], v)
                            for k, v in cfg.quality.budgets.items()
                            if k.split("/", 1)[0] == model.name and "/" in k
                        ),
                        workload_spec=w["spec"],
                    )
                )
    if m.atlas is not None:
        plan.entries.append(atlas_entry(plan.entries, m, cfg, resolve_model(m.models[0])))
    for name in m.real_models:
        plan.entries.append(real_model_entry(name, m, cfg))
    return plan


ATLAS = "atlas"
ALL_DTYPES = "all"


def atlas_entry(entries: list, m, cfg: NightlyConfig, model: ModelRef) -> Entry:
    """The atlas: the machine's first model on the atlas workload with every KV dtype the installed vLLM accepts
    (`--kv-dtypes all`), fixed load only."""
    w = cfg.workloads[m.atlas.workload].model_dump()
    w.update({k: v for k, v in (m.overrides.get(m.atlas.workload) or WorkloadOverride()).model_dump().items() if v})
    conc = [min(c, m.max_concurrency) if m.max_concurrency else c for c in w["concurrency"]]
    return Entry(
        name="/".join(p for p in (model.label, m.atlas.workload, ATLAS) if p),
        model=model,
        workload=m.atlas.workload,
        prompt_tokens=w["prompt_tokens"],
        output_tokens=w["output_tokens"],
        num_requests=w["num_requests"],
        concurrency=tuple(dict.fromkeys(conc)),
        api=w["api"],
        slo_name=None,
        slo=None,
        kv_dtypes=(ALL_DTYPES,),
        max_model_len=m.max_model_len,
        search_cap=None,
        extra_args=tuple(entries[0].extra_args) if entries else tuple(m.extra_args),
        notes=("the atlas: every KV dtype the installed vLLM accepts, fixed load only",),
        eval_tasks=tuple(cfg.quality.eval_tasks) if cfg.quality.eval_tasks is not None else None,
        budget_points=cfg.quality.budget_points,
        workload_spec=w["spec"],
        atlas=True,
        eval_limit=m.atlas.eval_limit,
        kv_scales=tuple(m.atlas.kv_scales),
    )


REAL_MODEL_PLAN = "real-model-plan"


def real_model_entry(name: str, m, cfg: NightlyConfig) -> Entry:
    """A registry real model's entry: its own plan (kvbench/data/realmodel_runs.toml), whose lengths the estimate
    reads; the run builds it from the model's name (harness/run/realplan.py)."""
    from kvbench.core.datafiles import load_toml

    own = load_toml("realmodel_runs.toml")[name]
    return Entry(
        name=f"{name}/{REAL_MODEL_PLAN}",
        model=ModelRef(name, name, name),
        workload=REAL_MODEL_PLAN,
        prompt_tokens=own["prompt_tokens"],
        output_tokens=own["output_tokens"],
        num_requests=own["num_requests"],
        concurrency=tuple(own["concurrency"]),
        api="completions",
        slo_name=None,
        slo=None,
        kv_dtypes=tuple(m.kv_dtypes),
        max_model_len=own["max_model_len"],
        search_cap=None,
        extra_args=(),
        notes=(f"{name}: its own plan (kvbench/data/realmodel_runs.toml)",),
        budget_points=cfg.quality.budget_points,
    )


def machine_folder(plan: MachinePlan) -> str:
    """The results folder a section's machine writes to (as kvbench.specs.machine names it)."""
    from kvbench.specs.machine import cpu_model, gpu_machine_name, slug

    if not plan.on_gpu:
        return f"cpu-{slug(cpu_model())}"
    gpu = plan.gpu
    name = gpu.nvml_names[0] if gpu.nvml_names else gpu.name
    return gpu_machine_name(name, gpu.device_memory_bytes, plan.serving_gpus)


def run_plan(
    entry: Entry,
    on_gpu: bool,
    results_dir: Path,
    machine: str | None = None,
    prices: dict[str, float] | None = None,
):
    """The harness RunPlan of one entry: RunSettings with the backend's defaults and the entry's values.
    Dtypes the installed vLLM does not accept are recorded as unsupported, not fatal (one bad dtype must not
    cost the night). `prices` (USD per GPU-hour by GPU key) put the bill on the run's fronts."""
    from kvbench.harness.run.realplan import build_plan
    from kvbench.harness.run.settings import RunSettings

    if entry.workload == REAL_MODEL_PLAN:  # the model's own plan: lengths, SLO, tasks and fidelity from its name
        real = RunSettings.for_machine(
            on_gpu,
            model=entry.model.name,
            kv_dtypes=list(entry.kv_dtypes),
            unknown_dtypes="record",
            results_dir=results_dir,
            machine=machine,
            accuracy_budget_points=entry.budget_points,
            prices=prices,
        )
        plan = build_plan(real)
        plan.notes.extend(entry.notes)
        return plan
    serve, note = served_model(entry.model, on_gpu)
    plan = build_plan(
        RunSettings.for_machine(
            on_gpu,
            model=serve,
            kv_dtypes=list(entry.kv_dtypes),
            concurrency=list(entry.concurrency),
            search_slo=entry.slo,
            no_search=entry.slo is None,
            search_cap=entry.search_cap,
            prompt_tokens=None if entry.workload_spec else entry.prompt_tokens,
            output_tokens=None if entry.workload_spec else entry.output_tokens,
            workload=entry.workload_spec,
            num_requests=entry.num_requests,
            # a spec's own lengths vary: its table's prompt + output tokens (the longest it sends) size the server
            max_model_len=entry.max_model_len or (entry.context if entry.workload_spec else None),
            api=entry.api,
            extra_args=list(entry.extra_args),
            unknown_dtypes="record",
            results_dir=results_dir,
            machine=machine,
            eval_tasks=list(entry.eval_tasks) if entry.eval_tasks is not None else None,
            accuracy_budget_points=entry.budget_points,
            prices=prices,
            # the atlas: capacity, accuracy and fidelity of every dtype; no ladder or repeats of emulated speed
            **(atlas_settings(entry) if entry.atlas else {}),
        )
    )
    plan.accuracy_budgets = dict(entry.budgets)
    if entry.model.name != TINY:
        plan.model_name = entry.model.name
    plan.notes.extend([*entry.notes, *([note] if note else [])])
    return plan


def atlas_settings(entry: Entry) -> dict:
    """What the atlas entry's run changes: no sweep or repeats (emulated dtypes' speed is not ranked), its eval
    limit, its scales variants."""
    return {"sweep": False, "repeat": 1, "eval_limit": entry.eval_limit, "kv_scales": list(entry.kv_scales) or None}


def served_model(model: ModelRef, on_gpu: bool) -> tuple[str | None, str | None]:
    """(what vLLM gets as --model, a note). An HF id already in the local Hugging Face cache is served
    from there: the run is then offline, and the harness reads its config.json for the capacity model and
    the "dtype not honoured" check (it cannot for a bare HF id). The workflow and the SkyPilot task
    download the models first (`kvbench nightly --print models`)."""
    if model.serve is None:  # the tiny model
        if not on_gpu:
            return None, None  # the plan builds and names it
        from kvbench.tinymodel.build import ensure_tiny_model

        return str(ensure_tiny_model()), None
    if model_kind(model.name) not in ("short", "hf"):
        return model.serve, None
    local = local_snapshot(model.serve)
    if local is None:
        return (
            model.serve,
            (
                f"{model.serve} is not in the local Hugging Face cache: "
                "vLLM downloads it, and the record has no capacity-model prediction"
            ),
        )
    return local, None


def local_snapshot(hf_id: str) -> str | None:
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(hf_id, local_files_only=True)
    except Exception:  # not cached, or huggingface_hub missing: vLLM fetches the id itself
        return None
