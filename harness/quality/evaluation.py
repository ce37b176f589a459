"""Task accuracy of a live server through lm-evaluation-harness (lm-eval 0.4.13, its `local-completions` model):
lm-eval's own task definitions and metrics, greedy (temperature 0), `num_concurrent` requests in flight, and
every item kept (doc id, prompt hash, target, response, score) so two KV dtypes can be compared item by item.

kvbench's own retrieval tasks (kvbench.specs.evaltasks) are written to the cache and registered through lm-eval's
`include_path`; any other task name goes to lm-eval as is (gsm8k, ruler, ...), and when its data needs the
Hugging Face hub on a machine without it, that is one line naming the bundled tasks, not a traceback.

Prompts are sent as text (`tokenized_requests=False`): the server tokenizes them as it does its users'
(BOS included); the local tokenizer (`tokenizer_backend=huggingface`, a local path) is only lm-eval's own
need (loglikelihood tasks, length checks). Nothing is written into the working directory.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from kvbench.core.errors import KvbenchError, UsageError
from kvbench.harness.client.evalhttp import completions_model
from kvbench.harness.server.endpoint import redact_url
from kvbench.specs import evaltasks

# Packaged dataset builders that read local files: a task built on them needs no hub.
LOCAL_BUILDERS = ("json", "csv", "parquet", "text", "arrow")


@dataclass
class ItemResult:
    doc_id: int
    prompt_sha256: str  # of the prompt text as sent
    target: str
    response: str  # the raw generation
    filtered: str  # after the task's filter (what the metric scored)
    score: float  # the metric for this item (0/1 for exact match)


@dataclass
class TaskResult:
    task: str
    metric: str  # "exact_match,exact": lm-eval's metric name and filter
    value: float  # lm-eval's aggregate
    n: int
    items: list[ItemResult] = field(default_factory=list)

    @property
    def scores(self) -> list[float]:
        return [i.score for i in self.items]


@dataclass
class EvalResult:
    tasks: dict[str, TaskResult]
    base_url: str  # redacted
    served_model: str
    num_concurrent: int
    limit: int | None
    lm_eval_version: str
    wall_s: float


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def check_tasks(tasks: list[str], task_manager) -> None:
    """Every name is a task lm-eval knows (kvbench's included); one line naming the choices otherwise."""
    known = set(task_manager.all_tasks)
    unknown = [t for t in tasks if t not in known]
    if unknown:
        bundled = ", ".join(evaltasks.task_names())
        raise UsageError(
            f"unknown task {unknown[0]!r}; choose a bundled task ({bundled}) or any lm-eval task "
            "(e.g. gsm8k, ruler); `lm-eval ls tasks` lists them"
        )


def _hub_message(task: str) -> str:
    return (
        f"{task} needs its dataset from the Hugging Face hub; on an offline machine use the bundled tasks: "
        f"{', '.join(evaltasks.task_names())}"
    )


def _offline() -> bool:
    return any(os.environ.get(v, "").lower() in ("1", "true", "yes") for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def check_offline(tasks: list[str], task_manager) -> None:
    """On an offline machine (HF_HUB_OFFLINE), refuse tasks whose dataset is on the hub before any request."""
    if not _offline():
        return
    for task in tasks:
        if task.startswith(evaltasks.PREFIX):
            continue
        entry = task_manager.task_index.get(task)
        cfg = getattr(entry, "cfg", None) or {}  # a group or tag has none: loading it will tell
        path = str(cfg.get("dataset_path") or "")
        if path and path not in LOCAL_BUILDERS and not Path(path).expanduser().exists():
            raise UsageError(_hub_message(task))


def task_manager(
    tasks: list[str],
    tokenizer: str | Path,
    n_items: int = evaltasks.DEFAULT_ITEMS,
    seed: int = evaltasks.SEED,
    max_seq_lengths: list[int] | None = None,
):
    """lm-eval's TaskManager with kvbench's retrieval tasks (those in `tasks`) written and included.

    `max_seq_lengths`: the context lengths lm-eval's synthetic long-context tasks (RULER's niah, cwe, fwe, qa,
    vt) generate items at, as lm-eval's `--metadata '{"max_seq_lengths": [...]}'`; they size their prompts with
    the tokenizer, which goes with it."""
    ours = [t for t in tasks if t.startswith(evaltasks.PREFIX)]
    for t in ours:
        evaltasks.parse_task(t)  # one line naming the bundled tasks if misspelt
    lengths = tuple(max_seq_lengths) if max_seq_lengths else None
    return _task_manager(tuple(sorted(set(ours))), len(ours) < len(tasks), str(tokenizer), n_items, seed, lengths)


@functools.lru_cache(maxsize=8)
def _task_manager(
    ours: tuple[str, ...], lm_evals: bool, tokenizer: str, n_items: int, seed: int, lengths: tuple[int, ...] | None
):
    # Indexing lm-eval's own task folder takes ~5-9 s on 2 cores: a run evaluates each dtype in six conditions,
    # so its worker builds the index once (whichever lm-eval tasks are asked), and not at all when every task is
    # kvbench's own (`lm_evals` false).
    from lm_eval.tasks import TaskManager

    include = [str(evaltasks.write_tasks(tokenizer, list(ours), seed=seed, n=n_items))] if ours else None
    metadata = {"tokenizer": tokenizer, "max_seq_lengths": list(lengths)} if lengths else None
    return TaskManager(include_path=include, include_defaults=lm_evals, metadata=metadata)


def evaluate(
    base_url: str,
    served_model: str,
    tokenizer: str | Path,
    tasks: list[str],
    *,
    num_concurrent: int = 1,
    limit: int | tuple[int, int] | None = None,
    headers: dict[str, str] | None = None,
    max_length: int | None = None,
    timeout_s: float = 300.0,
    n_items: int = evaltasks.DEFAULT_ITEMS,
    seed: int = evaltasks.SEED,
    max_seq_lengths: list[int] | None = None,
) -> EvalResult:
    """Run `tasks` against the OpenAI-compatible server at `base_url` (no /v1 suffix).

    `tokenizer`: a local folder with the served model's tokenizer. `headers`: sent with every request (an
    API key as `Authorization: Bearer ...`); without them lm-eval sends `Bearer $OPENAI_API_KEY`. `limit`: the
    first `limit` items of each task, or (start, stop). `max_seq_lengths`: lm-eval's RULER tasks (task_manager).
    Raises UsageError for unknown tasks or hub-only data offline."""
    import lm_eval
    from lm_eval.evaluator import simple_evaluate

    if not tasks:
        raise UsageError(
            f"no tasks given; choose from the bundled tasks ({', '.join(evaltasks.task_names())}) or lm-eval's"
        )
    if num_concurrent < 1:
        raise UsageError(f"num_concurrent must be at least 1, got {num_concurrent}")
    docs, limit = (limit, None) if isinstance(limit, tuple) else (None, limit)
    if limit is not None and limit < 1:
        raise UsageError(f"--limit must be at least 1, got {limit}")
    _quiet_lm_eval()
    lm_eval.evaluator.add_env_info = _no_env_survey
    tm = task_manager(tasks, tokenizer, n_items, seed, max_seq_lengths)
    check_tasks(tasks, tm)
    check_offline(tasks, tm)
    lm = completions_model(  # lm-eval's local-completions, following no redirect (it would carry the key)
        base_url=f"{base_url.rstrip('/')}/v1/completions",
        model=served_model,
        tokenizer_backend=None,  # given below, loaded by kvbench.core.tokenizer
        tokenized_requests=False,
        num_concurrent=num_concurrent,
        max_retries=1,  # a failed request is a finding, not something to hide behind retries
        timeout=int(timeout_s),
        header=dict(headers) if headers else None,
        **({"max_length": max_length} if max_length else {}),
    )
    _give_tokenizer(lm, tokenizer)
    t0 = time.monotonic()
    try:
        out = simple_evaluate(
            model=lm,
            tasks=list(tasks),
            task_manager=tm,
            limit=limit,
            samples={t: list(range(*docs)) for t in tasks} if docs else None,
            log_samples=True,
            gen_kwargs={"temperature": 0.0, "do_sample": False},
            random_seed=seed,
            numpy_random_seed=seed,
            torch_random_seed=None,  # the server generates: seeding torch here would only import it (~1 s)
            fewshot_random_seed=seed,
            bootstrap_iters=0,
        )
    except UsageError:
        raise
    except Exception as exc:  # dataset loading offline, an HTTP failure after retries, ...
        raise _explain(exc, tasks, base_url) from exc
    wall = time.monotonic() - t0
    return EvalResult(
        tasks={t: _task_result(t, out) for t in tasks},
        base_url=redact_url(base_url),
        served_model=served_model,
        num_concurrent=num_concurrent,
        limit=limit,
        lm_eval_version=lm_eval.__version__,
        wall_s=wall,
    )


def _explain(exc: Exception, tasks: list[str], base_url: str) -> KvbenchError:
    text = f"{type(exc).__name__}: {exc}"
    hub = (
        "huggingface.co" in text
        or "offline" in text.lower()
        or "ConnectionError" in text
        or type(exc).__name__ in ("DatasetNotFoundError", "LocalEntryNotFoundError", "OfflineModeIsEnabled")
    )
    foreign = [t for t in tasks if not t.startswith(evaltasks.PREFIX)]
    if hub and foreign:
        return UsageError(_hub_message(foreign[0]))
    first = text.splitlines()[0] if text else type(exc).__name__
    return KvbenchError(f"lm-eval against {redact_url(base_url)} failed: {first[:300]}")


def _task_result(task: str, out: dict) -> TaskResult:
    """The task's primary metric (its first metric under its first filter) and every item under that filter."""
    results = out["results"][task]
    samples = out["samples"][task]
    first_filter = samples[0]["filter"] if samples else None
    metric_key = next(
        k
        for k in results
        if "," in k
        and not k.split(",")[0].endswith("_stderr")
        and (first_filter is None or k.split(",", 1)[1] == first_filter)
    )
    metric, flt = metric_key.split(",", 1)
    items = []
    for s in samples:
        if s["filter"] != flt:
            continue
        args = s["arguments"]
        prompt = args["gen_args_0"]["arg_0"] if isinstance(args, dict) else args[0][0]
        resp = s["resps"][0][0] if s["resps"] and s["resps"][0] else ""
        filtered = s["filtered_resps"][0] if isinstance(s["filtered_resps"], list) else s["filtered_resps"]
        items.append(
            ItemResult(
                doc_id=int(s["doc_id"]),
                prompt_sha256=_sha(prompt),
                target=str(s["target"]),
                response=str(resp),
                filtered=str(filtered),
                score=float(s[metric]),
            )
        )
    items.sort(key=lambda i: i.doc_id)
    return TaskResult(task=task, metric=metric_key, value=float(results[metric_key]), n=len(items), items=items)


def _give_tokenizer(lm, tokenizer: str | Path) -> None:
    """What lm-eval 0.4.13's `tokenizer_backend="huggingface"` sets up (TemplateAPI.__init__), with the tokenizer
    from kvbench.core.tokenizer: the same object AutoTokenizer gives, without its ~4.5 s of imports in the worker."""
    from lm_eval.models.utils import configure_pad_token

    from kvbench.core.tokenizer import load_tokenizer

    lm.tokenizer_backend = "huggingface"
    lm.tokenizer = configure_pad_token(load_tokenizer(tokenizer))


def _no_env_survey(storage: dict) -> None:
    # lm-eval's add_env_info runs torch's collect_env (pip list, lscpu, ...: ~0.35 s) after every evaluation, a
    # run evaluates each dtype in six conditions, and kvbench records the machine itself (kvbench/specs/machine.py).
    storage["pretty_env_info"] = "not collected (kvbench records the environment in the run record)"


def _greedy_note(record: logging.LogRecord) -> bool:
    # lm-eval warns on every evaluation that gen_kwargs override the task's: kvbench's greedy decoding, on purpose
    return not str(record.msg).startswith("generation_kwargs:")


def _quiet_lm_eval() -> None:
    # lm-eval logs every request setting at INFO; kvbench reports progress itself (on stderr).
    for name in ("lm-eval", "lm_eval", "httpx"):
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.getLogger("lm_eval.evaluator").addFilter(_greedy_note)  # once: addFilter skips a filter it has
