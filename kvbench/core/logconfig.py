"""The two lines of a vLLM start-up that state its configuration, read as far as they go.

* The API server's `non-default args: {...}`: a Python dict repr. GitHub comments, terminals and `cut` truncate it
  (a big deployment's line runs to kilobytes), and a value may be no literal at all (`<CompilationMode.NONE: 0>`).
  It is read key by key with Python's own tokenizer: every pair that a `,` or the closing `}` ends is kept (its
  value through ast.literal_eval), a pair the cut runs through is dropped, a value that is no literal is named.
* The engine's `Initializing a V1 LLM engine (vX) with config: model='...', speculative_config=..., dtype=
  torch.bfloat16, max_seq_len=..., tensor_parallel_size=..., quantization=..., kv_cache_dtype=..., ...`: `key=value`
  pairs, values in repr or bare (`auto`, `torch.float16`, `SpeculativeConfig(method='mtp', ...)`), read the same way.

Both give `ConfigLine`: the pairs read, whether the line was whole, the last key read before a cut and the keys
whose values were unreadable.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from dataclasses import dataclass, field

_OPEN, _CLOSE = "([{", ")]}"
_QUOTES = ("'", '"')


@dataclass
class ConfigLine:
    """What one configuration line says, as far as it could be read."""

    values: dict = field(default_factory=dict)
    whole: bool = True  # False: the line was cut before its end
    last_key: str | None = None  # the last key read whole before the cut
    unreadable: list[str] = field(default_factory=list)  # keys whose value is no literal (kept as text in raw)
    raw: dict = field(default_factory=dict)  # every key's value as its text

    @property
    def cut(self) -> bool:
        return not self.whole


def _tokens(text: str):
    """Python's tokens of `text`, stopping (not raising) where the text ends inside a bracket or a string."""
    try:
        yield from tokenize.generate_tokens(io.StringIO(text).readline)
    except (tokenize.TokenError, SyntaxError, IndentationError):  # 3.12+ raises on an unterminated string
        return


def _offsets(text: str):
    starts = [0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    return lambda pos: starts[pos[0] - 1] + pos[1]


def read_args_dict(text: str) -> ConfigLine:
    """The `non-default args` dict from its `{` on, pair by pair (see the module docstring)."""
    out = ConfigLine(whole=False)
    at = _offsets(text)
    depth, key, value_start = 0, None, None
    for tok in _tokens(text):
        if tok.type == tokenize.ERRORTOKEN and tok.string.strip() in _QUOTES:
            break  # a string the cut left open
        if tok.type == tokenize.OP and tok.string in _OPEN:
            depth += 1
            if depth == 1:
                continue
        if depth == 1 and key is None:
            if tok.type == tokenize.STRING:
                key = _literal(tok.string)
                key = key if isinstance(key, str) else None
            elif tok.type == tokenize.OP and tok.string == "}":
                out.whole = True
                break
            continue
        if depth == 1 and value_start is None and tok.type == tokenize.OP and tok.string == ":":
            value_start = at(tok.end)
            continue
        ends = tok.type == tokenize.OP and (tok.string == "," and depth == 1 or tok.string == "}" and depth == 1)
        if ends and key is not None and value_start is not None:
            _keep(out, key, text[value_start : at(tok.start)].strip())
            key, value_start = None, None
            if tok.string == "}":
                out.whole = True
                break
            continue
        if tok.type == tokenize.OP and tok.string in _CLOSE:
            depth -= 1
    return out


def read_engine_config(text: str, ends_whole: bool = False) -> ConfigLine:
    """`key=value, key=value, ...` as the engine's config line prints it (after 'with config: '). `ends_whole`: the
    text is known to end where the pairs end (the inside of a closed bracket)."""
    out = ConfigLine()
    at = _offsets(text)
    depth, key, value_start, closed = 0, None, None, False
    pending = None
    for tok in _tokens(text):
        if tok.type == tokenize.ERRORTOKEN and tok.string.strip() in _QUOTES:
            out.whole = False
            return out
        if tok.type in (tokenize.NEWLINE, tokenize.NL, tokenize.ENDMARKER) and depth == 0:
            if key is not None and value_start is not None:
                pending = (key, text[value_start : at(tok.start)].strip())
            break
        if tok.type == tokenize.OP and tok.string in _OPEN:
            depth += 1
        elif tok.type == tokenize.OP and tok.string in _CLOSE:
            depth -= 1
        if depth == 0 and key is None and tok.type == tokenize.NAME:
            key = tok.string
            continue
        if depth == 0 and key is not None and value_start is None and tok.type == tokenize.OP and tok.string == "=":
            value_start = at(tok.end)
            continue
        if depth == 0 and tok.type == tokenize.OP and tok.string == "," and key is not None and value_start is not None:
            _keep(out, key, text[value_start : at(tok.start)].strip(), engine=True)
            key, value_start = None, None
            continue
        closed = tok.type in (tokenize.OP, tokenize.STRING) and (tok.string in _CLOSE or tok.type == tokenize.STRING)
    else:
        out.whole = False
        return out
    if depth != 0:
        out.whole = False
        return out
    # the last pair ends the line: whole unless the line may have been cut inside a bare value ("max_seq_len=2621")
    if pending and (closed or ends_whole):
        _keep(out, *pending, engine=True)
    elif pending or out.raw:  # a bare value at the end may be cut short; a line never ends with a comma
        out.whole = False
    return out


def _literal(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):
        return _NOT_LITERAL


_NOT_LITERAL = object()
_TORCH = re.compile(r"torch\.(\w{1,32})$")
_CALL = re.compile(r"(\w{1,64})\((.*)\)$", re.S)


def _keep(out: ConfigLine, key: str, text: str, engine: bool = False) -> None:
    out.raw[key] = text
    out.last_key = key
    value = _literal(text)
    if value is _NOT_LITERAL and engine:
        value = _engine_value(text)
    if value is _NOT_LITERAL:
        out.unreadable.append(key)
        return
    out.values[key] = value


def _engine_value(text: str):
    """A bare engine-line value: `auto` -> 'auto', `torch.bfloat16` -> 'bfloat16', `Name(a=1, b='x')` -> a dict of
    its fields (read like the line itself), anything else its text."""
    if m := _TORCH.match(text):
        return m[1]
    if m := _CALL.match(text):
        inner = read_engine_config(m[2], ends_whole=True)
        return {"_type": m[1], **inner.values} if inner.whole else _NOT_LITERAL
    if re.fullmatch(r"[\w.\-/:~+]{1,256}", text):
        return text
    return _NOT_LITERAL
