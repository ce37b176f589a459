"""Run records: the typed summary of one `kvbench run` (JSON, committed) and its samples (Parquet, not).

Layout, beside that machine's asv results (copying a machine's folder carries everything it measured):
    results/<machine>/runs/<run_id>.json               the summary, schema `kvbench.run/2` (schema.py's types)
    results/<machine>/runs/<run_id>.requests.parquet   one row per request: every timing, chunk arrivals, errors;
                                                       agreement requests too (prompt and output token ids)
    results/<machine>/runs/<run_id>.series.parquet     time series in long form: /metrics at 1 Hz, NVML at 10 Hz
    results/<machine>/runs/<run_id>.evals.parquet      every lm-eval item per dtype and condition (rest, load, ...)
Both Parquet files are zstd-compressed and named in the summary's `samples` block. DuckDB reads the whole
folder as one table: `SELECT * FROM 'results/*/runs/*.requests.parquet'`.

The summary is small enough to commit (a CPU-default run is well under 200 KB); the samples are what a night
keeps as CI artifacts. Everything that reads records (`report`, `compare`, `claims`, `history`, `regress`,
the dashboards) needs only the summary.

Readers accept `kvbench.run/1` (one JSON with every request inside) and `kvbench.run/2`. A v1 record is
upgraded on load to the v2 shape; its embedded requests stay readable through `samples_frame`
(`kvbench history upgrade` rewrites it as v2 for good).
Every record is validated on load: a damaged one is named with its path and the first bad field, never
half-believed.

The package, by what each module holds (none imports one listed after it):
    findings.py  what a finding is about (FindingKind), for pages and gates to switch on
    layout.py    every path under --results: runs, logs, evals, dated records
    repeats.py   repeated fixed-load phases: means with 95% intervals, paired differences to auto
    blocks.py    the eval and fidelity blocks' types and invariants, and the checks across a whole record
    schema.py    the pydantic types, statuses, phase kinds and the vocabularies readers share
    migrate.py   kvbench.run/1 records upgraded to the v2 shape, and their embedded samples
    storage.py   names and paths, atomic writes, the Parquet samples, validated reading
    queries.py   finding records, headline numbers, the pandas tables readers use
    reportrows.py  the rows `kvbench report` prints around its tables, out of one record's document
    upgrade.py   v1 records rewritten as v2 for good (`kvbench history upgrade`), each read back first
What most readers use is re-exported here: `from kvbench import records; records.X` is its public path; the rest
is imported from its module (`from kvbench.records import layout`, `kvbench.records.findings`, ...). To patch
a function for a test, patch it where it lives (e.g. `records.storage.replace_atomic`), which is where its
callers look it up.
"""

from kvbench.records.layout import RUNS_DIR, record_path
from kvbench.records.queries import (
    conditions,
    find_records,
    fixed_phase,
    headline,
    linked_records,
    note_skipped,
    read_records,
    representative,
    samples_frame,
    skipped_records,
    summary_frame,
    summary_rows,
    workload_label,
)
from kvbench.records.schema import (
    CONDITIONS,
    EMULATED_SPEED_REASON,
    SCHEMA,
    SCHEMA_V1,
    SCHEMAS,
    SPEED_FIELDS,
    Agreement,
    Capacity,
    Distribution,
    DtypeResult,
    DtypeStatus,
    EngineCapacityRecord,
    Finding,
    Front,
    FrontPoint,
    MeasuredCapacity,
    MetricsRecord,
    ModelCapacity,
    Phase,
    PhaseKind,
    PhaseSummary,
    RunRecord,
    RunStatus,
    SamplesRef,
    ServerInfo,
    Stat,
    Stop,
    StopReason,
    TelemetrySummary,
    derive_status,
    measured_anything,
)
from kvbench.records.storage import (
    EVALS_SUFFIX,
    PROBE_BYTES,
    REQUESTS_SUFFIX,
    SERIES_SUFFIX,
    SampleStore,
    check_writable,
    load_record,
    new_run_id,
    parse_record,
    read_record,
    samples_paths,
    utc_iso,
    utc_now,
    write_atomic,
    write_record,
)

__all__ = [
    "SCHEMA",
    "SCHEMA_V1",
    "SCHEMAS",
    "RunStatus",
    "DtypeStatus",
    "PhaseKind",
    "StopReason",
    "derive_status",
    "measured_anything",
    "Distribution",
    "PhaseSummary",
    "Phase",
    "EngineCapacityRecord",
    "ModelCapacity",
    "MeasuredCapacity",
    "Capacity",
    "ServerInfo",
    "Agreement",
    "TelemetrySummary",
    "MetricsRecord",
    "DtypeResult",
    "Stat",
    "FrontPoint",
    "Front",
    "Finding",
    "Stop",
    "SamplesRef",
    "RunRecord",
    "SPEED_FIELDS",
    "EMULATED_SPEED_REASON",
    "CONDITIONS",
    "RUNS_DIR",
    "REQUESTS_SUFFIX",
    "SERIES_SUFFIX",
    "EVALS_SUFFIX",
    "PROBE_BYTES",
    "new_run_id",
    "utc_now",
    "utc_iso",
    "record_path",
    "samples_paths",
    "check_writable",
    "write_atomic",
    "write_record",
    "SampleStore",
    "parse_record",
    "read_record",
    "load_record",
    "find_records",
    "read_records",
    "linked_records",
    "note_skipped",
    "skipped_records",
    "fixed_phase",
    "representative",
    "headline",
    "workload_label",
    "conditions",
    "summary_rows",
    "summary_frame",
    "samples_frame",
]
