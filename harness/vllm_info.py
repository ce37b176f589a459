"""Facts about the vLLM installed in a given Python, asked in a subprocess (vLLM is heavy to import)."""

from __future__ import annotations

import json
import subprocess
import sys
from functools import cache

from kvbench.errors import KvbenchError

_PROBE = """
import json, typing
from vllm.config.cache import CacheDType
print(json.dumps(list(typing.get_args(CacheDType))))
"""


@cache
def accepted_kv_dtypes(python: str = sys.executable) -> tuple[str, ...]:
    """The --kv-cache-dtype values the installed vLLM accepts (its CacheDType literal)."""
    try:
        out = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=180)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise KvbenchError(f"could not ask vLLM for its KV-cache dtypes: {exc}") from None
    if out.returncode != 0:
        if "No module named 'vllm'" in out.stderr:
            raise KvbenchError(f"vLLM is not installed for {python}; install kvbench[cpu] (no GPU) or kvbench[gpu]")
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise KvbenchError(f"could not ask vLLM for its KV-cache dtypes: {last}")
    return tuple(json.loads(out.stdout.strip().splitlines()[-1]))
