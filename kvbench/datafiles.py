"""Access to the data files shipped inside the package (kvbench/data/)."""

from __future__ import annotations

import tomllib
from functools import cache
from importlib import resources
from pathlib import Path

DATA = resources.files("kvbench") / "data"


def data_path(relative: str) -> Path:
    return Path(str(DATA / relative))


@cache
def load_toml(relative: str) -> dict:
    with (DATA / relative).open("rb") as fh:
        return tomllib.load(fh)
