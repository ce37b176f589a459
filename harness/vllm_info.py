"""Facts about the vLLM installed in a given Python, asked in a subprocess (vLLM is heavy to import)."""

from __future__ import annotations

import json
import subprocess
import sys
from functools import cache

from kvbench.errors import KvbenchError

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
    (on the CPU platform: what its stock CPU attention backend implements)}."""
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
