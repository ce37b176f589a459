"""A shard's folder: everything one shard of a night measured, and the manifest that says what it is.

    <shard folder>/
      shard.json         the manifest (written last: a folder without it is a shard that did not finish)
      summary.json       the shard's night summary (paths in it relative to results/)
      results/<machine>/ the files the shard's night added or changed: run records and their Parquet
                         samples, logs, and for the shard that owns the history point its asv result,
                         machine.json (and results/benchmarks.json)
      commits.bundle     the history-point commit(s) the shard made (git bundle), when it made any

The manifest names the night, the config section, the shard (i of N) and the units it owns, carries the
whole partition (so a merge knows what a shard that never arrived owned) and the config's text, and lists
every file with its SHA-256, so a copy damaged on its way through a bucket is caught.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvbench.core.errors import UsageError
from kvbench.records import layout

SCHEMA = "kvbench.shard/1"
MANIFEST = "shard.json"
SUMMARY = "summary.json"
BUNDLE = "commits.bundle"
RESULTS = "results"


class ShardManifest(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    schema_: Literal["kvbench.shard/1"] = Field(SCHEMA, alias="schema")
    night: str = Field(min_length=1)
    section: str
    machine: str | None  # the results folder name (None: the shard failed before it knew)
    shard: int = Field(ge=1)
    shards: int = Field(ge=1)
    units: list[str]  # what it owns (entry names, "history")
    plan: dict[str, Any]  # the section's partition (kvbench.orchestration.nightly.shards.ShardPlan.as_json)
    config: dict[str, str]  # path, sha256, text
    status: Literal["ok", "regression", "failed", "interrupted"]
    exit_code: int
    error: str | None = None  # why the shard as a whole failed (nothing or not all of it ran)
    host: str
    nodes: list[dict[str, Any]] = []
    started_at: str
    finished_at: str
    files: dict[str, str] = {}  # path relative to the shard folder -> SHA-256
    summary: str | None = None
    commits: str | None = None


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# -- what the night added -----------------------------------------------------------------------------


def _watched(results_dir: Path, machine: str) -> list[Path]:
    folder = layout.machine_dir(results_dir, machine)
    out = [p for p in folder.rglob("*") if p.is_file()] if folder.is_dir() else []
    bench = results_dir / "benchmarks.json"
    return out + ([bench] if bench.is_file() else [])


def snapshot(results_dir: Path, machine: str) -> dict[str, tuple[int, int]]:
    """(size, mtime) of every file a night may add or change, relative to results_dir."""
    out = {}
    for p in _watched(results_dir, machine):
        st = p.stat()
        out[str(p.relative_to(results_dir))] = (st.st_size, st.st_mtime_ns)
    return out


def changed(results_dir: Path, machine: str, before: dict[str, tuple[int, int]]) -> list[str]:
    """Files added or changed since `before` (temp files of atomic writes and the night summary left out)."""
    now = snapshot(results_dir, machine)
    return sorted(
        rel
        for rel, stat in now.items()
        if before.get(rel) != stat and not Path(rel).name.startswith(".") and Path(rel).parts[1:2] != ("nightly",)
    )


def git_head(repo: Path) -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def bundle(repo: Path, since: str | None, dest: Path) -> bool:
    """The commits since `since` (the history point's) as a git bundle; False when there are none."""
    head = git_head(repo)
    if since is None or head is None or head == since:
        return False
    out = subprocess.run(
        ["git", "bundle", "create", str(dest), f"{since}..HEAD"], cwd=repo, capture_output=True, text=True, timeout=120
    )
    return out.returncode == 0


# -- writing a shard folder ---------------------------------------------------------------------------


def prepare(out: Path, night: str, section: str, shard: int) -> Path:
    """An empty folder for the shard. A folder already holding this same shard (a rerun, e.g. after a spot
    recovery) is replaced; any other non-empty folder is refused, never cleared."""
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        try:
            old = read_manifest(out)
        except UsageError:
            old = None
        if old is None or (old.night, old.section, old.shard) != (night, section, shard):
            raise UsageError(
                f"--shard-out {out} is not empty and holds no earlier run of this shard; give a new folder"
            )
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    return out


def relative_paths(doc: dict, results_dir: Path) -> dict:
    """The night summary with every path under results_dir made relative to it (the shard moves)."""
    root = str(Path(results_dir).absolute()) + os.sep

    def rel(v):
        if isinstance(v, str) and v.startswith(root):
            return v[len(root) :]
        if isinstance(v, dict):
            return {k: rel(x) for k, x in v.items()}
        if isinstance(v, list):
            return [rel(x) for x in v]
        return v

    return rel(doc)


def pack(out: Path, results_dir: Path, files: list[str], summary: dict | None, repo: Path, head_before: str | None):
    """Copy the night's files under out/results/, write summary.json and the commits' bundle; the files'
    hashes (relative to out) for the manifest."""
    from kvbench.records import write_atomic

    hashes: dict[str, str] = {}
    for rel in files:
        src, dest = results_dir / rel, out / RESULTS / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest)
        hashes[f"{RESULTS}/{rel}"] = sha256(dest)
    if summary is not None:
        write_atomic(out / SUMMARY, relative_paths(summary, results_dir))
        hashes[SUMMARY] = sha256(out / SUMMARY)
    if bundle(repo, head_before, out / BUNDLE):
        hashes[BUNDLE] = sha256(out / BUNDLE)
    return hashes


def write_manifest(out: Path, manifest: ShardManifest) -> Path:
    from kvbench.records import write_atomic

    return write_atomic(Path(out) / MANIFEST, manifest.model_dump(mode="json", by_alias=True))


def config_block(path: Path) -> dict[str, str]:
    text = Path(path).read_text()
    return {"path": str(path), "sha256": hashlib.sha256(text.encode()).hexdigest(), "text": text}


def host() -> str:
    return socket.gethostname()


# -- reading one ----------------------------------------------------------------------------------------


def read_document(path: Path, parse: Callable[[str], Any], bad: tuple, missing: str, invalid: Callable) -> Any:
    """`parse` of the text at `path`; a one-line UsageError, `missing` when there is no such file and
    `invalid(exc)` when reading or parsing raises one of `bad` (shard manifests, the SkyPilot task template)."""
    try:
        return parse(path.read_text())
    except FileNotFoundError:
        raise UsageError(missing) from None
    except bad as exc:
        raise UsageError(invalid(exc)) from None


def read_manifest(folder: Path) -> ShardManifest:
    """The manifest of a shard folder, validated; one-line UsageError when it is missing or damaged."""
    import json

    path = Path(folder) / MANIFEST
    doc = read_document(
        path,
        json.loads,
        (OSError, UnicodeDecodeError, json.JSONDecodeError),
        f"{folder}: no {MANIFEST}: the shard did not finish (or this is not a shard folder)",
        lambda exc: f"{path}: not a JSON shard manifest ({exc})",
    )
    try:
        return ShardManifest.model_validate(doc)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        raise UsageError(f"{path}: damaged shard manifest: {where}: {err['msg']}") from None


def check_files(folder: Path, manifest: ShardManifest) -> list[str]:
    """Problems with the files the manifest lists: missing, altered, or present but unlisted."""
    problems = []
    for rel, digest in manifest.files.items():
        p = Path(folder) / rel
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            problems.append(f"{rel}: a path outside the shard folder")
        elif not p.is_file():
            problems.append(f"{rel}: listed in {MANIFEST} but missing")
        elif sha256(p) != digest:
            problems.append(f"{rel}: damaged (SHA-256 differs from {MANIFEST})")
    listed = set(manifest.files) | {MANIFEST}
    for p in sorted(Path(folder).rglob("*")):
        rel = str(p.relative_to(folder))
        if p.is_file() and rel not in listed:
            problems.append(f"{rel}: not listed in {MANIFEST}")
    return problems
