"""What `capacity --from-log` takes as the server's settings, and where each came from.

Every input of the prediction is looked up in order: the user's flag (shown as given, the log's value beside it
where they differ), the `non-default args` line (read as far as it goes: kvbench.core.logconfig), the engine's
`Initializing ... with config:` line, other lines that say it (`Worker_TP<k>` prefixes, `world_size=`,
"Using fp8 data type to store kv cache", "Chunked prefill is enabled with max_num_batched_tokens=N", ...), and
last vLLM's default. A default is never silent: where the args line is whole, a key it lacks is vLLM's default
(the line lists every non-default argument); where it is cut or absent, the value is *assumed* and listed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvbench.core.logparse import StartupLog
from kvbench.specs.vllm_memory import int_arg

# vLLM's argument name -> the engine line's name for it, where they differ
ENGINE_NAMES = {"max_model_len": "max_seq_len"}
# the settings the prediction reads, by vLLM's names, each with the flag that overrides it
FLAGS = {
    "model": "--model",
    "max_model_len": "--context",
    "kv_cache_dtype": "--kv-dtypes",
    "tensor_parallel_size": "--tensor-parallel-size",
    "pipeline_parallel_size": "--pipeline-parallel-size",
    "dtype": "--weights",
    "quantization": "--weights",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "block_size": "--block-size",
    "speculative_config": "--speculative",
    "vllm_version": "--vllm-version",
    "enable_prefix_caching": None,
    "disable_custom_all_reduce": None,
    "enforce_eager": None,
}


@dataclass(frozen=True)
class Input:
    """One setting as the prediction takes it."""

    name: str  # vLLM's name for it
    value: Any
    source: str  # "flag --x", "args", "engine line", "log: <what>", "vLLM default", "assumed: <why>"
    logged: Any = None  # what the log said, where a flag overrode it

    @property
    def assumed(self) -> bool:
        return self.source.startswith("assumed")


class Inputs(dict):
    """name -> Input, in FLAGS order."""

    def value(self, name: str, default=None):
        item = self.get(name)
        return default if item is None or item.value is None else item.value

    def assumed(self) -> list[Input]:
        return [i for i in self.values() if i.assumed]


def _args_state(log: StartupLog) -> str:
    line = log.args_line
    if line is None:
        return "absent"
    return "whole" if line.whole else "cut"


def _from_log(log: StartupLog, name: str) -> tuple[Any, str] | None:
    """(value, source) where the log says `name`; None where it does not."""
    if name in log.args:
        return log.args[name], "args"
    engine = ENGINE_NAMES.get(name, name)
    if engine in log.engine_config:
        value = log.engine_config[engine]
        if name == "speculative_config" and isinstance(value, dict):
            value = {k: v for k, v in value.items() if k != "_type"}
        return value, "engine line"
    return _second_source(log, name)


def _second_source(log: StartupLog, name: str) -> tuple[Any, str] | None:
    if name == "model":
        return (log.model, "log: `vllm serve` line") if log.model else None
    if name == "max_model_len":
        if log.max_model_len:
            return log.max_model_len, "log: 'Using max model len' / 'Maximum concurrency for N tokens'"
    if name == "kv_cache_dtype" and log.kv_dtype_line:
        return log.kv_dtype_line, "log: 'Using ... data type to store kv cache'"
    if name == "tensor_parallel_size":
        pp = log.pp_ranks_seen or 1
        if log.world_size and log.world_size % pp == 0:
            return log.world_size // pp, f"log: world_size={log.world_size} / {pp} pipeline stage(s)"
        if log.tp_ranks_seen and log.tp_ranks_seen > 1:
            return log.tp_ranks_seen, f"log: Worker_TP0..TP{log.tp_ranks_seen - 1} prefixes (at least)"
        if log.tp_ranks_seen == 1:  # a worker process per rank: several ranks, how many the excerpt does not show
            return 2, "assumed: at least 2 (a Worker_TP0 prefix means one process per rank; no other rank's line)"
    if name == "pipeline_parallel_size" and log.pp_ranks_seen:
        return log.pp_ranks_seen, f"log: Worker_PP0..PP{log.pp_ranks_seen - 1} prefixes"
    if name == "gpu_memory_utilization" and log.utilization is not None:
        return log.utilization, "log: 'Desired GPU memory utilization' / memory profile"
    if name == "max_num_batched_tokens" and log.batched_tokens_line:
        return log.batched_tokens_line, "log: 'Chunked prefill is enabled with max_num_batched_tokens'"
    if name == "vllm_version" and log.vllm_version:
        return log.vllm_version, "log: API server / engine version"
    return None


def resolve(log: StartupLog, given: dict[str, Any], defaults: dict[str, tuple[Any, str]]) -> Inputs:
    """Each input: `given` (flag values by vLLM's names, only those the user typed) over the log over `defaults`
    ((value, why) by name: vLLM's default for the release and GPU, worked out by the caller)."""
    state = _args_state(log)
    out = Inputs()
    for name, flag in FLAGS.items():
        seen = _from_log(log, name)
        if name in given and given[name] is not None:
            logged = seen[0] if seen else None
            out[name] = Input(name, given[name], f"flag {flag}", logged if logged != given[name] else None)
        elif seen is not None:
            out[name] = Input(name, *seen)
        elif name in defaults:
            value, why = defaults[name]
            if name not in _ARG_NAMES:
                out[name] = Input(name, value, f"assumed: {why} (the log does not say it)")
            elif state == "whole":
                out[name] = Input(name, value, f"vLLM default: {why} (the whole args line does not list it)")
            elif state == "cut":
                cut_at = log.args_line.last_key
                out[name] = Input(name, value, f"assumed: {why} (the args line is cut after '{cut_at}')")
            else:
                out[name] = Input(name, value, f"assumed: {why} (the log has no args line)")
    return out


# the keys that vLLM's non-default args line would list when set (the others are not CLI arguments)
_ARG_NAMES = set(FLAGS) - {"vllm_version"}


def args_summary(log: StartupLog) -> str | None:
    """One line about the args line when it is cut or partly unreadable: what was read, up to where."""
    line = log.args_line
    if line is None:
        return None
    parts = []
    if line.cut:
        parts.append(
            f"the log's 'non-default args' line is cut after '{line.last_key}' ({len(line.values)} keys read)"
            if line.last_key
            else "the log's 'non-default args' line is cut before its first whole key"
        )
    if line.unreadable:
        parts.append("values that are no literal, not read: " + ", ".join(line.unreadable))
    return "; ".join(parts) or None


def speculative(value) -> tuple[str, int] | None:
    """(method, num_speculative_tokens) from vLLM's speculative_config (args dict or engine line's fields)."""
    if not isinstance(value, dict):
        return None
    method = value.get("method")
    tokens = int_arg(value.get("num_speculative_tokens", value.get("num_spec_tokens")))
    if not isinstance(method, str) and isinstance(value.get("model"), str):
        method = "draft_model"
    return (method, tokens or 1) if isinstance(method, str) else None
