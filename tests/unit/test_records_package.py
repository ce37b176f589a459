"""The records package's docstring lists every module it holds, in an order where none imports one listed after
it, as it says: a module added or an import turned round makes it stale, and this fails."""

from __future__ import annotations

import re

import kvbench.records
from tests.unit.test_structure import ROOT, imports


def _listed() -> list[str]:
    return re.findall(r"^    (\w+)\.py  ", kvbench.records.__doc__, flags=re.M)


def test_the_docstring_lists_every_module_of_the_package():
    held = sorted(p.stem for p in (ROOT / "kvbench" / "records").glob("*.py") if p.stem != "__init__")
    assert sorted(_listed()) == held


def test_no_listed_module_imports_one_listed_after_it():
    order = _listed()
    graph = imports()
    for i, name in enumerate(order):
        later = {f"kvbench.records.{n}" for n in order[i + 1 :]}
        assert not graph[f"kvbench.records.{name}"] & later, name
