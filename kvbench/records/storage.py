"""Writing and reading run records: names and paths, atomic JSON summaries, the Parquet samples beside them,
and validated loading (a damaged record is named with its path and first bad field, never half-believed).

Layout, beside that machine's asv results (copying a machine's folder carries everything it measured):
    results/<machine>/runs/<run_id>.json               the summary (schema.py's types)
    results/<machine>/runs/<run_id>.requests.parquet   one row per request: every timing, chunk arrivals, errors;
                                                       agreement requests too (prompt and output token ids)
    results/<machine>/runs/<run_id>.series.parquet     time series in long form: /metrics at 1 Hz, NVML at 10 Hz
    results/<machine>/runs/<run_id>.evals.parquet      every lm-eval item per dtype and condition (rest, load, ...)
"""

from __future__ import annotations

import json
import math
import os
import secrets
import tempfile
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from kvbench.core.datafiles import jsonable, read_json
from kvbench.core.errors import UsageError
from kvbench.core.scrub import scrub_doc, scrub_table
from kvbench.records.blocks import check_scores, is_damage
from kvbench.records.layout import RUNS_DIR, machine_dir
from kvbench.records.migrate import upgrade_v1
from kvbench.records.schema import SCHEMA, SCHEMA_V1, SCHEMAS, RunRecord, SamplesRef

REQUESTS_SUFFIX = ".requests.parquet"
SERIES_SUFFIX = ".series.parquet"
EVALS_SUFFIX = ".evals.parquet"
FIDELITY_SUFFIX = ".fidelity.parquet"  # per item and condition: KL(auto || dtype) over its scored tokens
PROBE_BYTES = 64 << 10  # what check_writable writes (and removes) to find a full disk before measuring


# -- names and paths --------------------------------------------------------------------------------------


def new_run_id(machine: str, now: datetime | None = None) -> str:
    now = now or datetime.now(UTC)
    return f"{now:%Y%m%dT%H%M%SZ}-{machine}-{secrets.token_hex(3)}"


def utc_now() -> datetime:
    """Now, in UTC (every record's clock for dates; durations use time.perf_counter)."""
    return datetime.now(UTC)


def utc_iso(when: datetime | None = None) -> str:
    """ISO 8601 to the second, as records store dates."""
    return (when or utc_now()).isoformat(timespec="seconds")


def stem_of(path: Path | str) -> str:
    return Path(path).name.removesuffix(".json")


def samples_paths(path: Path) -> tuple[Path, Path, Path]:
    """(requests, series, evals) Parquet paths beside a record."""
    stem = Path(path).name.removesuffix(".json")
    return (
        path.with_name(stem + REQUESTS_SUFFIX),
        path.with_name(stem + SERIES_SUFFIX),
        path.with_name(stem + EVALS_SUFFIX),
    )


def check_writable(results_dir: Path, machine: str) -> Path:
    """Make sure records can be written under results_dir/<machine>/runs before anything is measured: create
    the folder and a probe file, remove the probe (and any folder this created, if it fails). One line if not."""
    target = machine_dir(results_dir, machine, RUNS_DIR)
    created = []
    probe = None
    try:
        for parent in reversed([target, *target.parents]):
            if not parent.exists():
                parent.mkdir()
                created.append(parent)
        fd, probe = tempfile.mkstemp(prefix=".kvbench-probe-", dir=target)
        try:
            os.write(fd, bytes(PROBE_BYTES))  # an empty probe passes on a full disk; bytes do not
        finally:
            os.close(fd)
        return target
    except OSError as exc:
        for folder in reversed(created):
            try:
                folder.rmdir()
            except OSError:
                pass
        raise UsageError(
            f"--results {results_dir}: cannot write run records to {target} ({exc.strerror or exc}); "
            "give a writable folder"
        ) from None
    finally:
        if probe:
            Path(probe).unlink(missing_ok=True)


# -- writing ----------------------------------------------------------------------------------------------


def _micro(obj):
    """Floats to 6 decimals: times are seconds, so that is 1 µs."""
    if isinstance(obj, float):
        return round(obj, 6)
    if isinstance(obj, dict):
        return {k: _micro(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_micro(v) for v in obj]
    return obj


def replace_atomic(path: Path, write) -> Path:
    """Write through a temp file in the same folder, fsync, rename: a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; records are for everyone to read
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_atomic(path: Path, doc: dict) -> Path:
    """A JSON document, compact, floats to 1 µs, every string scrubbed of credentials, written atomically."""
    text = json.dumps(_micro(scrub_doc(jsonable(doc))), separators=(",", ":")) + "\n"
    return replace_atomic(path, lambda fh: fh.write(text.encode()))


def write_record(path: Path, record: RunRecord, samples: SampleStore | None = None) -> Path:
    """The samples first (so the summary never names a file that is not there yet), then the summary."""
    if samples is not None:
        record.samples = samples.write(path)
    return write_atomic(path, record.as_doc())


# -- samples (Parquet) --------------------------------------------------------------------------------------


def _request_schema():
    import pyarrow as pa

    f64, i64 = pa.float64(), pa.int64()
    return pa.schema(
        [
            ("run_id", pa.string()),
            ("kv_cache_dtype", pa.string()),
            ("phase", pa.string()),
            ("phase_kind", pa.string()),
            ("phase_index", i64),
            ("warmup", pa.bool_()),
            ("index", i64),
            ("request_id", pa.string()),
            ("requested_output_tokens", i64),
            ("expected_prompt_tokens", i64),
            ("intended_send_s", f64),
            ("sent_s", f64),
            ("response_s", f64),
            ("first_chunk_s", f64),
            ("ttft_s", f64),
            ("e2e_s", f64),
            ("end_s", f64),
            ("schedule_lag_s", f64),
            ("chunk_arrivals_s", pa.list_(f64)),
            ("chunk_tokens", pa.list_(i64)),
            ("prompt_tokens", i64),
            ("completion_tokens", i64),
            ("finish_reason", pa.string()),
            ("ok", pa.bool_()),
            ("error_kind", pa.string()),
            ("error", pa.string()),
            ("http_status", i64),
            # agreement requests (phase "agreement"): the greedy sample and the teacher-forced scores vs auto
            ("prompt_ids", pa.list_(i64)),
            ("output_ids", pa.list_(i64)),
            ("logprobs", pa.list_(f64)),
            ("teacher_forced_logprobs", pa.list_(f64)),
        ]
    )


def _series_schema():
    import pyarrow as pa

    return pa.schema(
        [
            ("run_id", pa.string()),
            ("kv_cache_dtype", pa.string()),
            ("source", pa.string()),
            ("t", pa.float64()),
            ("gpu", pa.int64()),
            ("name", pa.string()),
            ("value", pa.float64()),
        ]
    )


def _eval_schema():
    import pyarrow as pa

    return pa.schema([*_item_keys(), *item_columns()])


def _item_keys():
    """Which run, dtype, condition and task an evaluated item's row belongs to (evals and fidelity Parquet)."""
    import pyarrow as pa

    return [
        ("run_id", pa.string()),
        ("kv_cache_dtype", pa.string()),
        ("condition", pa.string()),
        ("concurrency", pa.int64()),
        ("task", pa.string()),
    ]


def _fidelity_schema():
    import pyarrow as pa

    return pa.schema(
        [
            *_item_keys(),
            ("doc_id", pa.int64()),
            ("tokens", pa.int64()),  # scored positions: auto's continuation tokens
            ("kld_sum", pa.float64()),  # nats, summed over the tokens (a lower bound where method says top-k)
            ("kld_max", pa.float64()),
            ("top1_agree", pa.int64()),  # positions whose top token agrees with auto's at rest
            ("dlogp_sum", pa.float64()),  # log p(auto's token): this dtype minus auto at rest, summed
            ("gold_dlogp", pa.float64()),  # the gold answer's log p, this dtype minus auto at rest
            ("method", pa.string()),
        ]
    )


def item_columns() -> list:
    """One evaluated item's columns, in a run record's eval samples and in a `kvbench eval` record alike."""
    import pyarrow as pa

    return [
        ("doc_id", pa.int64()),
        ("prompt_sha256", pa.string()),
        ("target", pa.string()),
        ("response", pa.string()),
        ("filtered", pa.string()),
        ("score", pa.float64()),
    ]


def _finite(v):
    return v if not (isinstance(v, float) and not math.isfinite(v)) else None


class SampleStore:
    """The rows that go to Parquet: every request of every phase, and the /metrics and NVML series."""

    def __init__(self, run_id: str):
        self.run_id = run_id
        self.requests: list[dict] = []
        self.series: list[dict] = []
        self.evals: list[dict] = []
        self.fidelity: list[dict] = []  # harness/quality/fidelity.py's rows (_fidelity_schema)

    def add_eval(self, dtype: str, condition: str, concurrency: int, result) -> None:
        """Every item of an lm-eval run (kvbench.harness.quality.evaluation.EvalResult)."""
        for task, tr in result.tasks.items():
            for it in tr.items:
                self.evals.append(
                    {
                        "run_id": self.run_id,
                        "kv_cache_dtype": dtype,
                        "condition": condition,
                        "concurrency": concurrency,
                        "task": task,
                        "doc_id": it.doc_id,
                        "prompt_sha256": it.prompt_sha256,
                        "target": it.target,
                        "response": it.response,
                        "filtered": it.filtered,
                        "score": it.score,
                    }
                )

    def add_fidelity(self, rows: list[dict]) -> None:
        self.fidelity.extend({"run_id": self.run_id, **r} for r in rows)

    def add_requests(self, dtype: str, phase: str, kind: str, phase_index: int, results, warmup: bool = False) -> int:
        names = _request_schema().names
        for r in results:
            row = {k: v for k, v in r.as_dict().items() if k in names}
            row.update(
                run_id=self.run_id,
                kv_cache_dtype=dtype,
                phase=phase,
                phase_kind=kind,
                phase_index=phase_index,
                warmup=warmup,
            )
            self.requests.append(row)
        return len(results)

    def add_agreement(self, dtype: str, samples: list[dict], teacher_forced: list[list[float]] | None) -> None:
        for i, s in enumerate(samples):
            self.requests.append(
                {
                    "run_id": self.run_id,
                    "kv_cache_dtype": dtype,
                    "phase": "agreement",
                    "phase_kind": "agreement",
                    "phase_index": -1,
                    "warmup": False,
                    "index": i,
                    "ok": True,
                    "prompt_ids": s["prompt"],
                    "output_ids": s["tokens"],
                    "logprobs": s["logprobs"],
                    "teacher_forced_logprobs": teacher_forced[i] if teacher_forced is not None else None,
                }
            )

    def add_metrics(self, dtype: str, snapshots) -> int:
        for snap in snapshots:
            for name, value in snap.values.items():
                self.series.append(
                    {
                        "run_id": self.run_id,
                        "kv_cache_dtype": dtype,
                        "source": "metrics",
                        "t": snap.t,
                        "gpu": None,
                        "name": name,
                        "value": _finite(float(value)),
                    }
                )
        return len(snapshots)

    def add_telemetry(self, dtype: str, telemetry) -> int:
        fields = list(telemetry.fields)
        for row in telemetry.samples:
            sample = dict(zip(fields, row, strict=False))
            for name in fields[2:]:
                self.series.append(
                    {
                        "run_id": self.run_id,
                        "kv_cache_dtype": dtype,
                        "source": "nvml",
                        "t": sample["t"],
                        "gpu": int(sample["gpu"]),
                        "name": name,
                        "value": _finite(float(sample[name])),
                    }
                )
        return len(telemetry.samples)

    def write(self, record_file: Path) -> SamplesRef:
        import pyarrow as pa
        import pyarrow.parquet as pq

        requests_path, series_path, evals_path = samples_paths(Path(record_file))
        ref = SamplesRef(
            request_rows=len(self.requests),
            series_rows=len(self.series),
            eval_rows=len(self.evals),
            fidelity_rows=len(self.fidelity),
        )
        for rows, schema, path, attr in (
            (self.requests, _request_schema(), requests_path, "requests"),
            (self.series, _series_schema(), series_path, "series"),
            (self.evals, _eval_schema(), evals_path, "evals"),
            (
                self.fidelity,
                _fidelity_schema(),
                evals_path.with_name(stem_of(record_file) + FIDELITY_SUFFIX),
                "fidelity",
            ),
        ):
            if not rows:
                continue
            table = scrub_table(
                pa.Table.from_pylist([{k: _finite(row.get(k)) for k in schema.names} for row in rows], schema=schema)
            )
            replace_atomic(path, lambda fh, table=table: pq.write_table(table, fh, compression="zstd"))
            setattr(ref, attr, path.name)
        return ref


def sample_schema(table: str):
    """The Arrow schema of a samples table: "requests", "series" or "evals"."""
    schemas = {"requests": _request_schema, "series": _series_schema, "evals": _eval_schema}
    return {**schemas, "fidelity": _fidelity_schema}[table]()


# -- reading -----------------------------------------------------------------------------------------------


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "(top level)"
    if is_damage(err):  # a block's own check (records/blocks.py): the message carries its path and reason
        return err["msg"] if not err["loc"] else f"{where}.{err['msg']}"
    value = err.get("input")
    shown = repr(value)[:60] if not isinstance(value, (dict, list)) else type(value).__name__
    return f"{where}: {err['msg']} (got {shown})"


def parse_record(doc: Any, path: Path | str = "<record>") -> RunRecord:
    """Validate a record document (v1 or v2) into the v2 types; one-line UsageError when it is not one."""
    schema = doc.get("schema") if isinstance(doc, dict) else None
    if not isinstance(schema, str) or not schema.startswith("kvbench.run/"):
        raise UsageError(f"{path}: not a kvbench run record (schema {schema!r}; expected {SCHEMA})")
    if schema not in SCHEMAS:
        raise UsageError(
            f"{path}: record schema {schema} is not supported by this kvbench (reads {', '.join(SCHEMAS)})"
        )
    try:
        if schema == SCHEMA_V1:
            doc = upgrade_v1(doc)
        return RunRecord.model_validate(doc)
    except ValidationError as exc:
        raise UsageError(f"{path}: damaged run record: {_first_error(exc)}") from None
    except (ValueError, TypeError, AttributeError) as exc:
        raise UsageError(f"{path}: damaged run record: {exc}") from None


def read_record(path: str | Path) -> RunRecord:
    """The typed record at `path` (v1 or v2), validated; its task summaries checked against the evals Parquet
    beside it, where that is here (records/blocks.check_scores)."""
    path = Path(path)
    doc = read_json(path, missing=f"run record not found: {path}", bad="not a JSON run record")
    record = parse_record(doc, path)
    evals = record.samples.evals if record.samples is not None else None
    if evals and any(d.eval for d in record.dtypes):
        why = _scores_problem(path.with_name(Path(evals).name), record)
        if why:
            raise UsageError(f"{path}: damaged run record: {why}")
    return record


def _scores_problem(evals: Path, record: RunRecord) -> str | None:
    """Why the summary's eval counts disagree with the items in `evals` (None: they agree, or it is not here:
    samples are CI artifacts a committed record may lack)."""
    try:
        stat = evals.stat()
    except OSError:
        return None
    try:
        frame = _eval_items(str(evals), stat.st_mtime_ns, stat.st_size)
    except Exception as exc:  # pyarrow's errors on a truncated or foreign file
        return f"samples.evals: {evals.name} cannot be read ({' '.join(str(exc).split())[:120]})"
    return check_scores(record.dtypes, frame)


@lru_cache(maxsize=64)
def _eval_items(path: str, _mtime_ns: int, _size: int):
    import pyarrow.parquet as pq

    columns = ["kv_cache_dtype", "condition", "task", "doc_id", "score"]
    return pq.read_table(path, columns=columns).to_pandas()


def load_record(path: str | Path) -> dict:
    """The record at `path` as a plain v2-shaped document (validated): what dict-based readers use."""
    doc = read_record(path).as_doc()
    return doc
