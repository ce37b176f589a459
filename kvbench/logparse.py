"""What vLLM's own log says: its KV-cache capacity report, the dtype it used, and why it failed.

vLLM 0.32+ prints one line (vllm/v1/core/kv_cache_utils.py):
    CPU KV cache size: 4,194,304 tokens, Maximum concurrency for 1,024 tokens per request: 4096.00x
older releases print two (`GPU KV cache size: N tokens` then `Maximum concurrency for M tokens per
request: X.XXx`); the device prefix is GPU, CPU, XPU... Both forms are accepted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Every pattern is bounded (no unbounded run before a literal) and only tried on lines holding its literal, and
# lines are cut to MAX_LINE_CHARS: a hostile 100 MB line or a 20 kB run of capitals costs linear time.
MAX_LINE_CHARS = 4096
_N = r"\d[\d,]{0,24}"
_X = r"\d{1,12}(?:\.\d{1,12})?"  # a decimal number, bounded
_DEVICE = r"(?<![A-Za-z])(?P<device>[A-Z]{1,8}(?: \+ host)?)"  # GPU, CPU, XPU, TPU ... (anchored, bounded)
ONE_LINE = re.compile(
    rf"{_DEVICE} KV cache size: (?P<tokens>{_N}) tokens, "
    rf"Maximum concurrency for (?P<per_req>{_N}) tokens per request: (?P<conc>{_X})x"
)
SIZE_LINE = re.compile(rf"{_DEVICE} KV cache size: (?P<tokens>{_N}) tokens\s*$")
CONC_LINE = re.compile(rf"Maximum concurrency for (?P<per_req>{_N}) tokens per request: (?P<conc>{_X})x")
DTYPE_LINE = re.compile(r"Using (?P<dtype>\S{1,64}) data type to store kv cache")
KV_MEMORY_LINE = re.compile(
    rf"(?:Available KV cache memory: (?P<gpu>{_X}) GiB|"
    rf"(?:Explicitly|Auto) set \((?P<cpu>{_X})/{_X}\) GiB for KV cache)"
)
ERROR_LINE = re.compile(r"(?<![A-Za-z_.])(?P<kind>[A-Za-z_.]{0,120}(?:Error|Exception)): (?P<msg>.+)$")
ARGPARSE_LINE = re.compile(r": error: (?P<msg>.+)$")


def bounded(lines) -> list[str]:
    """The lines as the patterns see them: each cut to MAX_LINE_CHARS."""
    return [line if len(line) <= MAX_LINE_CHARS else line[:MAX_LINE_CHARS] for line in lines]


@dataclass(frozen=True)
class EngineCapacity:
    """The capacity the engine itself reported."""

    device: str | None
    kv_tokens: int
    max_concurrency: float | None  # sequences of `tokens_per_request` tokens
    tokens_per_request: int | None
    source: str  # "log" or "metrics"
    kv_cache_gib: float | None = None
    num_blocks: int | None = None
    block_size: int | None = None
    cache_dtype: str | None = None


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def parse_capacity(lines: list[str]) -> EngineCapacity | None:
    """The last capacity report in a vLLM log, in either form; None if there is none yet."""
    found: EngineCapacity | None = None
    pending: tuple[str, int] | None = None
    kv_gib = None
    dtype = None
    for line in bounded(lines):
        if "KV cache" not in line and "Maximum concurrency" not in line and "data type" not in line:
            continue  # the literal every pattern here needs: most lines stop at this test
        if m := KV_MEMORY_LINE.search(line):
            kv_gib = float(m["gpu"] or m["cpu"])
        if m := DTYPE_LINE.search(line):
            dtype = m["dtype"]
        if "KV cache size" in line and (m := ONE_LINE.search(line)):
            found = EngineCapacity(
                m["device"], _int(m["tokens"]), float(m["conc"]), _int(m["per_req"]), "log", kv_gib, cache_dtype=dtype
            )
            pending = None
        elif "KV cache size" in line and (m := SIZE_LINE.search(line)):
            pending = (m["device"], _int(m["tokens"]))
            found = EngineCapacity(m["device"], _int(m["tokens"]), None, None, "log", kv_gib, cache_dtype=dtype)
        elif (m := CONC_LINE.search(line)) and pending:
            found = EngineCapacity(
                pending[0], pending[1], float(m["conc"]), _int(m["per_req"]), "log", kv_gib, cache_dtype=dtype
            )
            pending = None
    return found


SEGFAULT = "Segfault encountered"
FRAME = re.compile(r'File "(?P<file>[^"]{1,1024})", line \d{1,9}, in (?P<func>.+)$')


def _short_symbol(func: str) -> str:
    """'ns::Impl<(ns::ISA)1, T>::reshape_and_cache(T const*, ...)' -> 'Impl::reshape_and_cache'."""
    while (stripped := re.sub(r"<[^<>]*>", "", func)) != func:
        func = stripped
    return "::".join(func.split("(")[0].strip().split("::")[-2:])


def engine_failure(lines: list[str]) -> str | None:
    """Why a running engine died: a native crash (first frame past the signal handler) or its fatal error."""
    lines = bounded(lines)
    for i, line in enumerate(lines):
        if SEGFAULT in line:
            for frame in lines[i + 1 : i + 8]:
                m = FRAME.search(frame)
                if m and "sigaction" not in m["file"] and "<unknown>" not in m["file"]:
                    return f"segfault in {_short_symbol(m['func'])} ({m['file'].rsplit('/', 1)[-1]})"
            return "segfault"
    if any("EngineCore encountered a fatal error" in line for line in lines):
        return startup_error(lines) or "EngineCore encountered a fatal error"
    return None


def startup_error(lines: list[str]) -> str | None:
    """The most telling error line of a failed start: vLLM's argparse complaint or the last exception."""
    lines = bounded(lines)
    for line in reversed(lines):
        if ": error: " in line and (m := ARGPARSE_LINE.search(line)):
            return m["msg"].strip()
    for line in reversed(lines):
        if " WARNING " in line:  # e.g. vLLM's ulimit warning quotes an OSError it did not hit
            continue
        if ("Error: " in line or "Exception: " in line) and (m := ERROR_LINE.search(line)):
            return f"{m['kind'].rsplit('.', 1)[-1]}: {m['msg'].strip()}"
    return None
