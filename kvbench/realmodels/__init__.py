"""Real pretrained models from registry packages (kvbench/data/realmodels.toml), prepared for vLLM on first use.

`prepare(NAME)` finds the model's GGUF in its installed packages (kvbench.realmodels.source), checks its sha256,
dequantizes it to a bf16 safetensors folder (kvbench.realmodels.convert) and writes provenance.json beside the
weights: package, version, sha256, what the weights are. The folder is built under a temporary name and renamed
into place only when complete, so an interrupted conversion leaves nothing a run would use (a leftover temporary
folder is removed by the next prepare). Where: $KVBENCH_MODELS_DIR, else <kvbench's cache>/models
($KVBENCH_CACHE_DIR or the XDG user cache), or the folder a caller passes (`kvbench models prepare --models-dir`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

from kvbench.core.datafiles import cache_root, load_toml
from kvbench.core.errors import unknown_choice
from kvbench.realmodels.source import ModelPackageMissing, checked_file, install_command, locate

__all__ = [
    "PROVENANCE",
    "ModelPackageMissing",
    "Progress",
    "catalog",
    "entry",
    "install_command",
    "is_registered",
    "models_root",
    "prepare",
    "prepared_dir",
    "provenance_of",
]

PROVENANCE = "provenance.json"  # written last inside the folder: its presence marks a complete conversion
RECIPE = "1"  # bump when the conversion changes, so prepared folders are made again
ENV = "KVBENCH_MODELS_DIR"


def catalog() -> dict[str, dict]:
    """Registry name -> its table in kvbench/data/realmodels.toml (tables only: [texttasks] and the like are not
    models)."""
    return {k: v for k, v in load_toml("realmodels.toml").items() if isinstance(v, dict) and "packages" in v}


def is_registered(name: str | None) -> bool:
    return bool(name) and name in catalog()


def entry(name: str) -> dict:
    models = catalog()
    if name not in models:
        raise unknown_choice("real model", name, models)
    return models[name]


def models_root(root: str | Path | None = None) -> Path:
    if root is not None:
        return Path(root).expanduser()
    return Path(os.environ.get(ENV) or cache_root() / "models")


def _folder_name(name: str, sha256: str) -> str:
    return f"{name}-{sha256[:12]}-r{RECIPE}"


def prepared_dir(name: str, root: str | Path | None = None) -> Path | None:
    """The complete prepared folder of `name` under the root, or None when there is none (nothing is checked
    against the installed package: that is prepare's job)."""
    base = models_root(root)
    for folder in sorted(base.glob(f"{name}-*-r{RECIPE}")):
        if (folder / PROVENANCE).is_file():
            return folder
    return None


def provenance_of(folder: str | Path | None) -> dict | None:
    """A prepared folder's provenance.json (None for a folder kvbench did not prepare, or no folder)."""
    if not folder:
        return None
    path = Path(folder).expanduser() / PROVENANCE
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


class Progress:
    """What prepare reports: each step's text, and how far the step is (MB of the GGUF hashed, tensors
    dequantized). Silent by default."""

    def step(self, text: str) -> None: ...
    def advance(self, done: int, total: int) -> None: ...


@contextlib.contextmanager
def _locked(base: Path, name: str) -> Iterator[None]:
    """One prepare of a model at a time per folder; the lock file stays (empty) for the next."""
    base.mkdir(parents=True, exist_ok=True)
    with open(base / f".{name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def prepare(
    name: str,
    root: str | Path | None = None,
    progress: Progress | None = None,
    force: bool = False,
    convert: Callable | None = None,
) -> Path:
    """The prepared folder of registry model `name`, converted now unless a complete one for the installed
    package's file is there (or `force`). `convert`: the converter (tests pass a stand-in)."""
    meta = entry(name)
    progress = progress or Progress()
    source = locate(name, meta)  # ModelPackageMissing: the pip command, before any work
    base = models_root(root)
    final = base / _folder_name(name, source.expected_sha256)
    if (final / PROVENANCE).is_file() and not force:
        return final
    if convert is None:
        from kvbench.realmodels.convert import convert
    with _locked(base, name):
        if (final / PROVENANCE).is_file() and not force:  # another process finished it while we waited
            return final
        for stale in base.glob(f".{name}-*.tmp"):  # an interrupted conversion's leftovers (we hold the lock)
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", suffix=".tmp", dir=base))
        try:
            start = time.monotonic()
            progress.step(f"checking {source.filename} ({source.size / 1e6:.0f} MB, sha256)")
            work = tmp / ".gguf"
            work.mkdir()
            mb = max(1, source.size // 1_000_000)
            gguf, sha = checked_file(source, work, lambda n, done=[0]: _advance(progress, done, n, mb))
            out = tmp / "model"
            out.mkdir()
            facts = convert(gguf, out, add_bos=bool(meta.get("add_bos")), step=progress.step, advance=progress.advance)
            shutil.rmtree(work)
            doc = _provenance(name, meta, source, sha, facts, time.monotonic() - start)
            (out / PROVENANCE).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
            if final.exists():
                shutil.rmtree(final)
            out.rename(final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _advance(progress: Progress, done: list[int], n: int, total_mb: int) -> None:
    done[0] += n
    progress.advance(min(done[0] // 1_000_000, total_mb), total_mb)


def _provenance(name: str, meta: dict, source, sha: str, facts: dict, seconds: float) -> dict:
    return {
        "model": name,
        "hf_id": meta.get("hf_id"),
        "package": source.package,
        "version": source.version,
        "install": install_command(meta),
        "gguf": source.filename,
        "sha256": sha,
        "weights": meta["weights"],
        "licence": meta.get("licence"),
        "bos_added": bool(meta.get("add_bos")),
        "recipe": RECIPE,
        "converted_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "conversion_s": round(seconds, 1),
        **facts,
    }
