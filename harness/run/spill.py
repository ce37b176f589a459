"""Writing a run's record when the disk is (nearly) full: what was measured is never lost to ENOSPC.

`check_space` runs before anything is measured (records.check_writable's probe writes nothing, so a full
disk passed it) and refuses a results folder without room for a record. `flush` writes the record as
records.write_record does, but:
  - before writing, it compares the free space with an estimate of what the write needs; too little, and it
    writes the summary without new samples (the Parquet files of the last good flush stay named);
  - on ENOSPC / EDQUOT it writes the summary alone, and if even that fails, the summary goes to the temp
    folder, and if that fails too, to stderr;
and returns a line saying where the record went, which the runner turns into a non-zero exit.
"""

from __future__ import annotations

import errno
import json
import shutil
import sys
import tempfile
from pathlib import Path

from kvbench import records
from kvbench.core.datafiles import jsonable
from kvbench.core.errors import KvbenchError, UsageError
from kvbench.core.scrub import scrub_doc

# What a results folder must hold free before a run starts: a summary (< 200 KB) and the first flush's samples.
MIN_FREE_BYTES = 64 << 20
# Rough bytes per stored sample row (Parquet compresses well below this; the estimate errs on the safe side).
ROW_BYTES = {"requests": 600, "series": 60, "evals": 400, "fidelity": 200}
FULL = (errno.ENOSPC, errno.EDQUOT)


class DiskFull(KvbenchError):
    """The run finished (or stopped) but its record could not be written whole where it belongs."""

    def __init__(self, record: records.RunRecord, path: Path, where: str):
        super().__init__(where)
        self.record, self.path = record, path


def free_bytes(folder: Path) -> int | None:
    """Free bytes for an unprivileged writer under `folder` (its nearest existing parent); None if unknown."""
    folder = Path(folder)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def check_space(results_dir: Path, need: int = MIN_FREE_BYTES) -> None:
    """One line when the results folder's disk has less than `need` bytes free (before anything is measured)."""
    free = free_bytes(results_dir)
    if free is not None and free < need:
        raise UsageError(
            f"--results {results_dir}: {free / 2**20:,.1f} MiB free on its disk, a run needs at least "
            f"{need / 2**20:,.0f} MiB for its record and samples; free some space or give another folder"
        )


def estimate(record: records.RunRecord, samples: records.SampleStore | None) -> int:
    """Bytes a flush writes: the summary (its JSON now) and its samples at ROW_BYTES a row, twice over (each file
    is written beside the old one, then renamed)."""
    size = len(json.dumps(record.as_doc(), default=str))
    if samples is not None:
        size += sum(len(getattr(samples, table)) * n for table, n in ROW_BYTES.items())
    return 2 * size


def flush(path: Path, record: records.RunRecord, samples: records.SampleStore | None) -> str | None:
    """Write the record (and its samples where there is room); None, or where it went and why when the disk
    was full."""
    free = free_bytes(path.parent)
    if free is not None and samples is not None and free < estimate(record, samples):
        note = (
            f"the disk under {path.parent} has {free / 2**20:,.1f} MiB free, too little for this flush's samples: "
            "the summary was written without them"
        )
        return _summary_only(path, record, note)
    try:
        records.write_record(path, record, samples)
        return None
    except OSError as exc:
        if exc.errno not in FULL:
            raise
        return _summary_only(path, record, f"the disk under {path.parent} is full ({exc.strerror})")


def _summary_only(path: Path, record: records.RunRecord, why: str) -> str:
    """The summary alone at `path`, else in the temp folder, else on stderr; where it went, as one line."""
    try:
        records.write_record(path, record, None)
        return f"{why}; the record (without its latest samples) is at {path}"
    except OSError as exc:
        if exc.errno not in FULL:
            raise
    spare = Path(tempfile.gettempdir()) / path.name
    try:
        records.write_record(spare, record, None)
        return f"{why}; the record could not be written there either and is at {spare} (without its samples)"
    except OSError:
        sys.stderr.write(json.dumps(scrub_doc(jsonable(record.as_doc()))) + "\n")
        return f"{why}; no disk would take the record: it was written to stderr above (without its samples)"
