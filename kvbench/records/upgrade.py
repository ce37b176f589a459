"""Rewriting kvbench.run/1 records (every request inside one JSON) as kvbench.run/2 for good: the summary
through the v2 types, the embedded samples into the Parquet files a v2 run writes, each record read back and
put back as it was if anything would differ (`kvbench history upgrade`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvbench.core.datafiles import read_json
from kvbench.core.errors import KvbenchError, one_line
from kvbench.records import migrate, queries, storage
from kvbench.records.schema import SCHEMA, SCHEMA_V1
from kvbench.records.storage import SampleStore, _request_schema, parse_record, write_record


def rewrite_v1(path, doc: dict):
    """Rewrite the kvbench.run/1 record at `path` (`doc`, already read) as kvbench.run/2: the same summary, and
    its embedded requests, agreement outputs and /metrics and NVML samples moved into the Parquet files beside it
    (what a v2 run writes). Returns the v2 record; the caller checks it reads back the same."""
    record = parse_record(doc, path)
    store = SampleStore(record.run_id)
    names = set(_request_schema().names)
    store.requests = [{k: v for k, v in row.items() if k in names} for row in migrate.v1_rows(doc, "requests")]
    store.series = migrate.v1_rows(doc, "series")
    for d in doc.get("dtypes") or []:
        dtype = d.get("kv_cache_dtype")
        agreement = d.get("agreement")
        if isinstance(agreement, dict) and agreement.get("samples"):
            store.add_agreement(dtype, agreement["samples"], agreement.get("teacher_forced"))
        tel = d.get("telemetry") or {}
        if tel.get("samples"):
            store.add_telemetry(dtype, _Telemetry(tel["fields"], tel["samples"]))
    record.schema_ = SCHEMA
    write_record(path, record, store)
    return record


def upgrade_records(where, dry_run: bool = False) -> list[tuple[str, str]]:
    """Every kvbench.run/1 record under `where` rewritten as kvbench.run/2 (rewrite_v1), then read back: the
    summary must equal the v1 reading (floats at v2's 6 decimals) and every embedded sample must be in the Parquet
    files, unchanged; otherwise the v1 file is put back and the record named ("left as ..."), and the next one
    goes on. Returns (path, outcome) per v1 record, and per file that could not be read as a record. With
    `dry_run`, each v1 record is read and checked the same way and nothing is written."""
    outcomes = []
    for path in queries.find_records(where):
        try:
            original = path.read_bytes()
            doc = read_json(path, missing=f"run record not found: {path}", bad="not a JSON run record")
            if not isinstance(doc, dict) or doc.get("schema") != SCHEMA_V1:
                continue
            before = storage._micro(storage.parse_record(doc, path).as_doc())
            expected = _v1_samples(doc, path)
        except KvbenchError as exc:
            outcomes.append((str(path), f"left as it was: {exc}"))
            continue
        except (OSError, TypeError, ValueError, KeyError, AttributeError) as exc:  # N-P1: odd v1 records
            outcomes.append((str(path), f"left as it was: its embedded samples cannot be read ({one_line(exc)})"))
            continue
        if dry_run:
            outcomes.append((str(path), "would be rewritten as kvbench.run/2 (--dry-run: nothing written)"))
            continue
        try:
            rewrite_v1(path, doc)
            problem = _differs(before, storage.load_record(path), expected, path)
        except (OSError, KvbenchError) as exc:  # a full disk, a read-back that fails: the v1 file goes back
            problem = str(exc)
        if problem:
            storage.replace_atomic(path, lambda fh, original=original: fh.write(original))
            for name in storage.samples_paths(path):
                if not name.is_dir():  # a folder where a Parquet file goes is not kvbench's to remove (N-P1)
                    name.unlink(missing_ok=True)
            outcomes.append((str(path), f"left as kvbench.run/1: {problem}"))
        else:
            outcomes.append((str(path), f"kvbench.run/2 ({len(original) / 1e6:.1f} MB of JSON before)"))
    return outcomes


def _v1_samples(doc: dict, path) -> dict:
    """What the rewrite must carry over: the v1 reading of the requests and /metrics tables, and the samples the
    v1 summary kept itself (agreement outputs: {dtype: tokens of each}; NVML: {dtype: rows in long form})."""
    agreement, nvml = {}, {}
    for d in doc.get("dtypes") or []:
        dtype = d.get("kv_cache_dtype")
        kept = (d.get("agreement") or {}).get("samples") if isinstance(d.get("agreement"), dict) else None
        if kept:
            agreement[dtype] = [list(s["tokens"]) for s in kept]
        tel = d.get("telemetry") or {}
        if tel.get("samples"):
            nvml[dtype] = len(tel["samples"]) * (len(tel["fields"]) - 2)  # one row per field beyond t and gpu
    tables = {t: queries.samples_frame([path], t) for t in ("requests", "series")}
    return {"tables": tables, "agreement": agreement, "nvml": nvml}


def _differs(before: dict, after: dict, expected: dict, path) -> str | None:
    """What the rewrite changed, or None: the summary apart from its schema and samples fields, each samples
    table's v1 rows, and the samples the v1 summary kept itself, now rows of the requests (agreement) and series
    (NVML) tables."""
    strip = ("schema", "samples")
    if {k: v for k, v in before.items() if k not in strip} != {k: v for k, v in after.items() if k not in strip}:
        return "its summary reads differently"
    for table, old in expected["tables"].items():
        new = queries.samples_frame([path], table)
        if table == "requests":
            rows = new[new.phase_kind == "agreement"]
            moved = {d: [list(t) for t in g.output_ids] for d, g in rows.groupby("kv_cache_dtype", sort=False)}
            if moved != expected["agreement"]:
                return "the agreement outputs differ from the summary's"
            new = new[new.phase_kind != "agreement"]
        else:
            rows = new[new.source == "nvml"]
            if rows.groupby("kv_cache_dtype", sort=False).size().to_dict() != expected["nvml"]:
                return "the NVML samples differ from the summary's"
            new = new[new.source != "nvml"]
        new = new.reset_index(drop=True)
        if len(new) != len(old):
            return f"{table}: {len(old)} rows before, {len(new)} after"
        for col in old.columns:
            if [_plain(v) for v in old[col]] != [_plain(v) for v in new[col]]:
                return f"{table}.{col} differs"
    return None


def _plain(v):
    """A cell as plain Python (arrays as lists, NaN as None), so a v1 frame and a Parquet frame compare."""
    v = v.tolist() if hasattr(v, "tolist") else v
    return None if isinstance(v, float) and math.isnan(v) else v


@dataclass
class _Telemetry:
    fields: list
    samples: list
