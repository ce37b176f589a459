"""kvbench's prediction for a vLLM start-up log: the model and GPU it ran, its settings as the log states them (or as
flags override them, or as vLLM's defaults fill them, each said: kvbench.cli.commands.fromlog_inputs), vLLM's non-KV
memory on each rank and the KV accounting of the group."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from kvbench.cli.commands.fromlog_inputs import Inputs, resolve, speculative
from kvbench.core.errors import UsageError
from kvbench.core.logparse import StartupLog
from kvbench.specs.capacity import VLLM_DEFAULT_BLOCK_SIZE, CapacityRow, capacity_for_ranks
from kvbench.specs.formats import get_format
from kvbench.specs.gpus import GpuSpec, catalog, get_gpu
from kvbench.specs.models import ModelSpec, by_hf_id, load_model
from kvbench.specs.speculative import SpeculativeSpec, parse_speculative, speculative_flag, with_speculative
from kvbench.specs.vllm_memory import (
    NonKvEstimate,
    Runtime,
    int_arg,
    predict_non_kv,
    release,
    scheduler_knobs,
    server_inputs,
)


@dataclass(frozen=True)
class LogOverrides:
    """What the command line says over (or in place of) the log: `capacity`'s flags, None where not given."""

    model: str | None = None
    gpu: str | None = None
    context: int | None = None
    kv_dtype: str | None = None
    utilization: float | None = None
    tp: int | None = None
    pp: int | None = None
    weights: str | None = None
    vllm_version: str | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    block_size: int | None = None
    speculative: str | None = None
    prefix_caching: bool | None = None  # no capacity flag: a caller (a test case) that knows the server's setting

    def by_vllm_name(self) -> dict:
        """The flags the user gave, by vLLM's argument names (fromlog_inputs.FLAGS)."""
        given = {
            "model": self.model,
            "max_model_len": self.context,
            "kv_cache_dtype": self.kv_dtype,
            "tensor_parallel_size": self.tp,
            "pipeline_parallel_size": self.pp,
            "gpu_memory_utilization": self.utilization,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "block_size": self.block_size,
            "vllm_version": self.vllm_version,
            "speculative_config": self.speculative,
            "enable_prefix_caching": self.prefix_caching,
        }
        return {k: v for k, v in given.items() if v is not None}


@dataclass(frozen=True)
class LogPrediction:
    spec: ModelSpec  # the model as served: speculative decoding's draft layers included
    card: GpuSpec
    estimate: NonKvEstimate
    row: CapacityRow
    max_len: int
    inputs: Inputs
    speculative: SpeculativeSpec | None
    mamba_cache_mode: str | None

    def astuple(self):
        return self.spec, self.card, self.estimate, self.row, self.max_len


def gpu_for_total(total_gib: float | None) -> GpuSpec | None:
    """The catalog GPU whose torch-reported total is within 0.1 GiB of what the log says."""
    if total_gib is None:
        return None
    near = [g for g in catalog().values() if g.torch_total_gib and abs(g.torch_total_gib - total_gib) <= 0.1]
    return min(near, key=lambda g: abs(g.torch_total_gib - total_gib)) if near else None


def _gpu(log: StartupLog, source: Path, flag: str | None) -> GpuSpec:
    if flag:
        return get_gpu(flag)
    card = gpu_for_total(log.total_gib)
    if card is not None:
        return card
    choices = ", ".join(catalog())
    if log.total_gib is None:
        raise UsageError(
            f"{source}: the log does not say which GPU it ran on (no line with the device's total memory); "
            f"pass --gpu NAME, one of: {choices}"
        )
    raise UsageError(
        f"{source}: no GPU in kvbench's catalog reports {log.total_gib:g} GiB (the log's device total); "
        f"pass --gpu NAME, one of: {choices}"
    )


def resolve_model_for_log(model: str | None, hf_id: str | None, source: Path) -> ModelSpec:
    """--model's spec, else the shipped model the log names."""
    if model is not None:
        return load_model(model)
    name = by_hf_id(hf_id) if hf_id else None
    if name is None:
        if not hf_id:
            raise UsageError(f"{source}: the log does not name the model; pass --model NAME or PATH/config.json")
        raise UsageError(
            f"{source}: model {hf_id!r} is not among kvbench's shipped models; pass --model NAME or PATH/config.json"
        )
    return load_model(name)


def _defaults(card: GpuSpec, version: str | None, max_len: int | None, spec: ModelSpec) -> dict:
    rel = release(version)
    knobs = scheduler_knobs(rel, card, max_len or spec.max_position_embeddings)
    return {
        "max_model_len": (spec.max_position_embeddings, "the config's max_position_embeddings (vLLM's default)"),
        "kv_cache_dtype": ("auto", "auto"),
        "tensor_parallel_size": (1, "one GPU"),
        "pipeline_parallel_size": (1, "one stage"),
        "dtype": ("auto", "the config's torch_dtype"),
        "quantization": (None, "none: the checkpoint's quantization_config decides"),
        "gpu_memory_utilization": (rel.default_gpu_memory_utilization, f"vLLM {rel.version}'s"),
        "max_num_seqs": (knobs.max_num_seqs, knobs.source),
        "max_num_batched_tokens": (knobs.max_num_batched_tokens, knobs.source),
        "block_size": (VLLM_DEFAULT_BLOCK_SIZE, "CUDA's"),
        "speculative_config": (None, "no speculative decoding"),
        "vllm_version": (rel.version, "the newest release kvbench models"),
        "enable_prefix_caching": (None, "the release's default for the model"),
        "disable_custom_all_reduce": (False, "custom all-reduce on"),
        "enforce_eager": (False, "CUDA graphs captured"),
    }


def log_prediction(log: StartupLog, source: Path, flags: LogOverrides = LogOverrides()) -> LogPrediction:
    """kvbench's prediction with the log's settings, flags overriding them, vLLM's defaults filling the rest."""
    spec = resolve_model_for_log(flags.model, log.model, source)
    card = _gpu(log, source, flags.gpu)
    version = flags.vllm_version or log.vllm_version
    inputs = resolve(log, flags.by_vllm_name(), _defaults(card, version, flags.context or log.max_model_len, spec))
    max_len = int_arg(inputs.value("max_model_len"))
    if not max_len:
        raise UsageError(f"{source}: the log does not say max_model_len; pass --context")
    server = server_inputs({k: i.value for k, i in inputs.items()})
    if flags.weights not in (None, "auto"):
        server.update(weights=flags.weights, dtype=None)
    spec_dec = _speculative(inputs, spec)
    served = with_speculative(spec, spec_dec)
    fmt = get_format(str(inputs.value("kv_cache_dtype", "auto")))
    est = predict_non_kv(
        served,
        card,
        utilization=float(inputs.value("gpu_memory_utilization")),
        **server,
        vllm_version=version,
        max_model_len=max_len,
        runtime=runtime_of(log, inputs, spec_dec),
    )
    block = int_arg(inputs.value("block_size")) or VLLM_DEFAULT_BLOCK_SIZE
    mode = mamba_cache_mode(log, inputs)
    row = capacity_for_ranks(
        served,
        [fmt],
        max_len,
        est,
        card,
        block,
        vllm_version=version,
        mamba_cache_mode=mode,
        async_scheduling=spec_dec.async_scheduling if spec_dec else None,
    )[0]
    return LogPrediction(served, card, est, row, max_len, inputs, spec_dec, mode)


def _speculative(inputs: Inputs, spec: ModelSpec) -> SpeculativeSpec | None:
    value = inputs.value("speculative_config")
    if isinstance(value, str):  # --speculative METHOD[:N][@DRAFT]
        return speculative_flag(value, spec)
    found = speculative(value)
    if found is None:
        return None
    method, tokens = found
    return parse_speculative(f"{method}:{tokens}", spec)


_GRAPH_MODE = re.compile(r"cudagraph_mode'?\s*[:=]\s*['<]?(?:CUDAGraphMode\.)?([A-Z_]{4,32})")


def runtime_of(log: StartupLog, inputs: Inputs, spec_dec: SpeculativeSpec | None) -> Runtime:
    """Custom all-reduce and the CUDA-graph mode as the log says them: --enforce-eager, a compilation_config's
    cudagraph_mode, else vLLM's fallback to PIECEWISE under speculative decoding, else FULL_AND_PIECEWISE."""
    eager = inputs.value("enforce_eager") is True
    raw = " ".join(
        str(x)
        for x in (
            (log.args_line.raw.get("compilation_config") if log.args_line else None),
            (log.engine_line.raw.get("compilation_config") if log.engine_line else None),
        )
        if x
    )
    m = _GRAPH_MODE.search(raw)
    if eager or (m and m[1] == "NONE"):
        mode = "eager"
    elif m and m[1] in ("PIECEWISE", "FULL_AND_PIECEWISE"):
        mode = m[1].lower()
    else:
        mode = "piecewise" if spec_dec and spec_dec.layers else "full_and_piecewise"
    return Runtime(custom_all_reduce=inputs.value("disable_custom_all_reduce") is not True, cudagraph=mode)


def mamba_cache_mode(log: StartupLog, inputs: Inputs) -> str | None:
    """The log's own word ("Mamba cache mode is set to 'align'"), else the args, else prefix caching's setting
    (on: align, off: none); None: the release's default (kvbench.specs.vllm_accounting)."""
    if log.mamba_cache_mode in ("none", "align", "all"):
        return log.mamba_cache_mode
    mode = log.args.get("mamba_cache_mode")
    if mode in ("none", "align", "all"):
        return mode
    caching = inputs.value("enable_prefix_caching")
    return {True: "align", False: "none"}.get(caching) if isinstance(caching, bool) else None


def predict_for_log(log: StartupLog, source: Path, flags: LogOverrides = LogOverrides()):
    """(spec, card, estimate, row, max_len): log_prediction as a tuple (what the reference-log tests unpack)."""
    return log_prediction(log, source, flags).astuple()
