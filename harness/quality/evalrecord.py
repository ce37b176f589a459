"""Eval records: what `kvbench eval` (and the eval phase of a run) measured, as a small JSON summary and every
item in Parquet, in the house style of run records (atomic writes, beside the machine's other results):

    results/<machine>/evals/<eval_id>.json           schema `kvbench.eval/1`: per task, dtype and concurrency,
                                                     accuracy with its Wilson interval; the paired comparison
                                                     with auto (McNemar exact p, Newcombe interval, verdict),
                                                     at load against at rest, the detectable drop
    results/<machine>/evals/<eval_id>.items.parquet  one row per item and run: task, dtype, concurrency, doc id,
                                                     prompt sha256, target, response, filtered, score

`summarize` is the one place those numbers are derived from lm-eval's items (kvbench.harness.quality.evaluation).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvbench.core import stats
from kvbench.core.scrub import scrub_table
from kvbench.harness.quality.evaluation import EvalResult
from kvbench.records import new_run_id, utc_iso, write_atomic
from kvbench.records.storage import item_columns, replace_atomic

SCHEMA = "kvbench.eval/1"
ITEMS_SUFFIX = ".items.parquet"
REFERENCE = "auto"


@dataclass(frozen=True)
class RunKey:
    dtype: str
    concurrency: int


def _accuracy(scores: list[float]) -> dict:
    n = len(scores)
    k = int(sum(1 for s in scores if s >= 1.0))
    lo, hi = stats.wilson(k, n)
    return {"n": n, "correct": k, "accuracy": k / n if n else None, "ci95": [lo, hi]}


def _binary(scores: list[float]) -> bool:
    return all(s in (0.0, 1.0) for s in scores)


def _paired(ref: dict[int, float], cand: dict[int, float]) -> dict | None:
    """The comparison on the items both runs answered (None when the metric is not 0/1 or none are shared)."""
    shared = sorted(set(ref) & set(cand))
    r, c = [int(ref[i]) for i in shared], [int(cand[i]) for i in shared]
    if not shared or not _binary([*r, *c]):
        return None
    cmp = stats.compare(r, c)
    return {
        "n": cmp.n,
        "difference": cmp.difference,
        "ci95": [cmp.ci_low, cmp.ci_high],
        "p_value": cmp.p_value,
        "losses": cmp.losses,
        "gains": cmp.gains,
        "significant": cmp.significant,
        "verdict": cmp.verdict,
        # at the observed gain rate: a dtype that also gains items hides part of a drop (1% gains at 500 items
        # move the detectable drop from 1.6 to about 2.8 points)
        "detectable_drop": stats.detectable_drop(cmp.n, gain_rate=cmp.gains / cmp.n),
    }


def summarize(results: dict[RunKey, EvalResult], reference: str = REFERENCE) -> dict:
    """{task: {dtype: {concurrency: {...accuracy, vs_reference, vs_rest}}}} from each run's items.

    vs_reference: this dtype against `reference` at the same concurrency; vs_rest: this dtype at this
    concurrency against itself at concurrency 1 (a dtype that changes under load is a finding of its own).
    """
    out: dict[str, dict] = {}
    by_item: dict[tuple[str, str, int], dict[int, float]] = {}
    for key, res in results.items():
        for task, tr in res.tasks.items():
            by_item[(task, key.dtype, key.concurrency)] = {i.doc_id: i.score for i in tr.items}
    for (task, dtype, conc), items in sorted(by_item.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
        metric = next(r.tasks[task].metric for k, r in results.items() if k.dtype == dtype and k.concurrency == conc)
        entry = {"metric": metric, **_accuracy(list(items.values()))}
        if not _binary(list(items.values())):
            entry["accuracy"] = sum(items.values()) / len(items) if items else None
            entry["ci95"] = None  # Wilson needs 0/1 scores
        if dtype != reference and (task, reference, conc) in by_item:
            entry["vs_reference"] = _paired(by_item[(task, reference, conc)], items)
        if conc != 1 and (task, dtype, 1) in by_item:
            entry["vs_rest"] = _paired(by_item[(task, dtype, 1)], items)
        out.setdefault(task, {}).setdefault(dtype, {})[str(conc)] = entry
    return out


def new_eval_id(machine: str) -> str:
    return new_run_id(machine)


def _items_table(results: dict[RunKey, EvalResult]):
    import pyarrow as pa

    cols: dict[str, list] = {
        k: []
        for k in (
            "task",
            "kv_cache_dtype",
            "concurrency",
            "doc_id",
            "prompt_sha256",
            "target",
            "response",
            "filtered",
            "score",
        )
    }
    for key, res in results.items():
        for task, tr in res.tasks.items():
            for it in tr.items:
                for name, value in (
                    ("task", task),
                    ("kv_cache_dtype", key.dtype),
                    ("concurrency", key.concurrency),
                    ("doc_id", it.doc_id),
                    ("prompt_sha256", it.prompt_sha256),
                    ("target", it.target),
                    ("response", it.response),
                    ("filtered", it.filtered),
                    ("score", it.score),
                ):
                    cols[name].append(value)
    schema = pa.schema(
        [
            ("task", pa.string()),
            ("kv_cache_dtype", pa.string()),
            ("concurrency", pa.int32()),
            *item_columns(),
        ]
    )
    return pa.table(cols, schema=schema)


def write_eval_record(path: Path, doc: dict, results: dict[RunKey, EvalResult]) -> Path:
    """The items Parquet first, then the summary that names it (a summary never points at nothing)."""
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    items = path.with_name(path.name.removesuffix(".json") + ITEMS_SUFFIX)
    table = scrub_table(_items_table(results))
    replace_atomic(items, lambda fh: pq.write_table(table, fh, compression="zstd"))
    doc = {**doc, "items": {"path": items.name, "rows": table.num_rows}}
    write_atomic(path, doc)
    return path


def new_doc(
    eval_id: str,
    machine: str,
    model: str,
    tasks: list[str],
    limit: int | None,
    concurrency: list[int],
    servers: dict[str, dict],
    results: dict[RunKey, EvalResult],
    notes: list[str],
) -> dict:
    """The summary document (schema kvbench.eval/1)."""
    any_result = next(iter(results.values()), None)
    return {
        "schema": SCHEMA,
        "eval_id": eval_id,
        "created": utc_iso(),
        "machine": machine,
        "model": model,
        "tasks": tasks,
        "limit": limit,
        "concurrency": concurrency,
        "reference": REFERENCE,
        "lm_eval_version": any_result.lm_eval_version if any_result else None,
        "servers": servers,
        "runs": [
            {
                "kv_cache_dtype": k.dtype,
                "concurrency": k.concurrency,
                "wall_s": r.wall_s,
                "tasks": {t: {"metric": tr.metric, "value": tr.value, "n": tr.n} for t, tr in r.tasks.items()},
            }
            for k, r in results.items()
        ],
        "summary": summarize(results),
        "notes": notes,
        "stats_note": (
            "accuracy: Wilson 95% interval; vs auto / vs rest: paired items, McNemar exact test, "
            "Newcombe (1998) method 10 interval for the difference; detectable_drop: smallest true drop "
            "found with 80% power at alpha 0.05 when the dtype also gains items at the observed rate"
        ),
    }
