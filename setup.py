"""Package discovery for the wheel; everything else is declared in pyproject.toml.

kvbench's top-level folders install as subpackages of `kvbench` (harness/ as kvbench.harness, and so on), so
that `kernels/` never shadows Hugging Face's `kernels` package, which transformers probes for by import name.
pyproject's `packages.find` cannot map a folder to a prefixed name, so the packages are found here, under each
mapped folder: a new subpackage is picked up without a list to keep (tests/test_wheel.py builds the wheel).
"""

from setuptools import find_namespace_packages, setup

PACKAGE_DIRS = {
    "kvbench": "kvbench",
    "kvbench.harness": "harness",
    "kvbench.kernels": "kernels",
    "kvbench.dashboards": "dashboards",
}


def packages() -> list[str]:
    found = []
    for name, folder in PACKAGE_DIRS.items():
        # namespace discovery: data folders (kvbench/data/...) are packages too, so their files are package data
        found += [name, *(f"{name}.{sub}" for sub in find_namespace_packages(folder, exclude=["*__pycache__*"]))]
    return found


setup(package_dir=PACKAGE_DIRS, packages=packages())
