"""Reading data files: the ones shipped inside the package (kvbench/data/), and JSON files a user names; and
the plain JSON types every document kvbench writes is made of (`jsonable`). No rich or pyarrow here: the
records layer writes through this module, and the kernels sweep runs on a bare GPU box without either."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import tempfile
import tomllib
from collections.abc import Callable
from dataclasses import asdict, is_dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import platformdirs

from kvbench.core.errors import UsageError

DATA = resources.files("kvbench") / "data"


def cache_root() -> Path:
    """Where built files are cached (test models, generated task files): $KVBENCH_CACHE_DIR or the user cache."""
    return Path(os.environ.get("KVBENCH_CACHE_DIR") or platformdirs.user_cache_dir("kvbench"))


def write_text_atomic(path: Path, text: str) -> None:
    """`text` into `path` through a temporary file beside it: a reader sees the old file or the whole new one."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def cached_answer(kind: str, key: list | None, compute: Callable[[], Any]) -> Any:
    """compute()'s JSON-able answer, kept as cache_root()/kind/<digest of key>.json and read back while `key`
    (everything the answer depends on) is unchanged; key None: computed every time. A damaged entry is computed
    and written again; a cache that cannot be written costs speed, not the answer."""
    if key is None:
        return compute()
    digest = hashlib.sha256(json.dumps(key, default=str).encode()).hexdigest()[:16]
    path = cache_root() / kind / f"{digest}.json"
    if path.is_file():
        with contextlib.suppress(ValueError):
            return json.loads(path.read_text())
    answer = compute()
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(answer))
    return answer


def distribution_key(*names: str) -> list | None:
    """What says an installed distribution changed: the first of `names` installed, its version and its RECORD
    (which every install rewrites); None when none is installed."""
    import importlib.metadata as md

    for name in names:
        with contextlib.suppress(md.PackageNotFoundError):
            dist = md.distribution(name)
            return [name, dist.version, dist.read_text("RECORD") or ""]
    return None


# A folder whose files stand in for the shipped kvbench/data/ files of the same relative name (the others are
# still read from the package): a test or a user tries an edited copy of, say, formats.toml (a new KV dtype)
# without touching the installed one.
ENV_DATA_DIR = "KVBENCH_DATA_DIR"


def data_path(relative: str) -> Path:
    """The data file `relative` resolves to: $KVBENCH_DATA_DIR/<relative> when that file exists, else the
    shipped one."""
    overlay = os.environ.get(ENV_DATA_DIR)
    if overlay and (Path(overlay) / relative).is_file():
        return Path(overlay) / relative
    return Path(str(DATA / relative))


def entry_error(relative: str, table: str, key: str, exc: Exception | str) -> UsageError:
    """A catalog entry (`[table.key]` of the data file `relative`, an overlay's or the shipped one) that does not
    hold what kvbench reads from it: one line naming the file, the entry and the field (N-P12)."""
    if isinstance(exc, KeyError):
        what = f"lacks the field {exc.args[0]!r}"
    elif isinstance(exc, str):
        what = exc
    else:
        what = f"holds a value kvbench cannot use ({' '.join(str(exc).split())[:100]})"
    return UsageError(f"{data_path(relative)}: [{f'{table}.' if table else ''}{key}] {what}")


def load_toml(relative: str) -> dict:
    """The parsed data file (read once per resolved path, so an overlay set later is still honoured)."""
    return _load_toml(data_path(relative))


@cache
def _load_toml(path: Path) -> dict:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError) as exc:  # N-P12: an overlay that is no TOML
        where = (
            f" (from ${ENV_DATA_DIR})" if os.environ.get(ENV_DATA_DIR) and not str(path).startswith(str(DATA)) else ""
        )
        raise UsageError(f"{path}{where}: not a readable TOML data file ({' '.join(str(exc).split())[:120]})") from None


def read_json(path: Path, *, missing: str | None = None, bad: str = "not valid JSON") -> Any:
    """Parse a JSON file, or raise a one-line UsageError: `missing` when it does not exist (None: the
    caller has checked, FileNotFoundError passes), "<path>: <bad> (<reason> at line N)" when it is not JSON."""
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        if missing is None:
            raise
        raise UsageError(missing) from None
    except IsADirectoryError:
        raise UsageError(f"{path} is a folder, not a file; give the JSON file itself") from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path}: {bad} ({exc.msg} at line {exc.lineno})") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path}: {bad} (not UTF-8 text)") from None


def jsonable(obj):
    """Plain JSON types; non-finite floats become null (JSON has no NaN)."""
    if is_dataclass(obj) and not isinstance(obj, type):
        return jsonable(asdict(obj))
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, Path):
        return str(obj)
    return obj
