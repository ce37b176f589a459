"""Dataset kinds: ShareGPT conversations and JSONL prompt files, read and filtered as vLLM does."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvbench.core.errors import UsageError
from kvbench.harness.workloads.context import _Context, _rng
from kvbench.harness.workloads.plan import PlannedRequest
from kvbench.harness.workloads.spec import explain

# --- dataset files ----------------------------------------------------------------------------------


def _vllm_valid(prompt_len: int, output_len: int, s, fixed_output: bool) -> bool:
    """vLLM's is_valid_sequence with the spec's limits."""
    return not (
        prompt_len < s.min_tokens
        or (not fixed_output and output_len < s.min_tokens)
        or prompt_len > s.max_prompt_tokens
        or prompt_len + output_len > s.max_total_tokens
    )


def _order_random(ctx: _Context) -> random.Random:
    # Stream 0: vLLM's own random.seed(seed) sequence. Other streams: another order of the same rows.
    seed = ctx.seed if ctx.stream == 0 else int(_rng(ctx.seed, ctx.stream, "dataset").integers(2**63))
    return random.Random(seed)


def _sharegpt(ctx: _Context, num_requests):
    """As vLLM's ShareGPTDataset: keep entries with 2+ conversation turns, shuffle (random.seed(seed)),
    walk them: first turn = prompt, second = completion, skip pairs failing is_valid_sequence (and, here,
    pairs that do not fit max_model_len), stop at num_requests, then oversample with random.choice."""
    s = ctx.spec
    pairs = _sharegpt_pairs(s.path)
    rows = list(range(len(pairs)))
    order = _order_random(ctx)
    if s.shuffle:
        order.shuffle(rows)
    # No count asked for: every conversation that passes the filter, none repeated.
    everything = num_requests is None and s.num_requests is None
    n = ctx.n(num_requests, natural=len(rows))
    fixed_output = s.output_tokens is not None
    picked, too_long = [], 0
    for i in rows:
        if len(picked) >= n:
            break
        source, prompt_text, completion = pairs[i]
        prompt_len = len(ctx.tok(prompt_text).input_ids)
        out = s.output_tokens if fixed_output else len(ctx.tok(completion).input_ids)
        if not _vllm_valid(prompt_len, out, s, fixed_output):
            continue
        if ctx.mml is not None and prompt_len + out > ctx.mml:
            too_long += 1
            continue
        prompt, ids = ctx.text(prompt_text)
        picked.append((source, prompt, out, ids))
    if not picked:
        raise UsageError(
            f"{s.path}: no conversation passes the length filter (prompt and output >= {s.min_tokens}, "
            f"prompt <= {s.max_prompt_tokens}, total <= {s.max_total_tokens}"
            + (f", total <= max_model_len {ctx.mml}" if ctx.mml else "")
            + " tokens)"
        )
    if too_long:
        ctx.notes.append(f"{too_long} conversations skipped: prompt + output exceeds max_model_len {ctx.mml}")
    extra = []
    if len(picked) < n and not everything:
        if s.oversample:
            # vLLM's maybe_oversample_requests: random.seed(seed), then random.choice per missing request.
            again = _order_random(ctx)
            extra = [again.choice(picked) for _ in range(n - len(picked))]
            ctx.notes.append(
                f"{len(extra)} of {n} requests repeat a conversation (oversampled, as vLLM does: "
                f"only {len(picked)} pass the filter)"
            )
        else:
            ctx.notes.append(f"only {len(picked)} of {n} requested conversations pass the filter (oversample = false)")
    reqs = [
        PlannedRequest(k, prompt, out, source=i, token_ids=ids)
        for k, (i, prompt, out, ids) in enumerate(picked + extra)
    ]
    return ctx.plan(reqs)


def _sharegpt_pairs(path: str) -> tuple[tuple[int, str, str], ...]:
    """(entry index, first turn, second turn) of every entry with 2+ turns, in file order (vLLM's filter)."""
    st = Path(path).stat()
    return _sharegpt_pairs_cached(path, st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=4)
def _sharegpt_pairs_cached(path: str, mtime_ns: int, size: int) -> tuple[tuple[int, str, str], ...]:
    # Every phase builds its own plan; the real ShareGPT file is hundreds of MB of JSON, so it is parsed once and
    # only the two turns vLLM reads are kept.
    data = _read_json(path)
    if not isinstance(data, list):
        raise UsageError(
            f'{path}: a ShareGPT file is a JSON list of {{"conversations": [...]}} entries, got {type(data).__name__}'
        )
    pairs = []
    for i, entry in enumerate(data):
        if not isinstance(entry, dict):
            raise UsageError(f'{path}: entry {i} is {type(entry).__name__}, not an object with "conversations"')
        conv = entry.get("conversations")
        if isinstance(conv, list) and len(conv) >= 2:
            for turn in conv[:2]:
                if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
                    raise UsageError(
                        f'{path}: entry {i} (id {entry.get("id")!r}): conversation turns need a text "value"'
                    )
            pairs.append((i, conv[0]["value"], conv[1]["value"]))
    return tuple(pairs)


class _JsonlLine(BaseModel):
    # Data rows, not a spec: other keys (ids, metadata) are allowed and ignored, as vLLM's custom loader does.
    model_config = ConfigDict(extra="ignore", strict=True)
    prompt: str | None = Field(None, min_length=1, description="text")
    prompt_tokens: int | None = Field(None, ge=1, description="a whole number >= 1")
    output_tokens: int | None = Field(None, ge=1, description="a whole number >= 1")


def _jsonl(ctx: _Context, num_requests):
    s = ctx.spec
    lines = []
    for lineno, where, row in validated_lines(s.path, _JsonlLine):
        if (row.prompt is None) == (row.prompt_tokens is None):
            raise UsageError(f'{where}: give either "prompt" (text) or "prompt_tokens" (a count), not both or neither')
        if row.output_tokens is None and s.output_tokens is None:
            raise UsageError(f'{where}: no "output_tokens" (give it per line, or output_tokens in the workload)')
        lines.append((lineno - 1, row))
    if not lines:
        raise UsageError(f"{s.path}: no requests (one JSON object per line)")
    order = _order_random(ctx)
    if s.shuffle:
        order.shuffle(lines)
    n = ctx.n(num_requests, natural=len(lines))
    reqs, clipped, skipped, repeats = [], 0, 0, 0
    asked_out, cut_out = 0, 0  # output lengths the context cannot hold: said, never clipped silently
    for k in range(n):
        source, row = lines[k % len(lines)]
        out = s.output_tokens or row.output_tokens
        if row.prompt is not None:
            repeats += k >= len(lines)
            prompt, ids = ctx.text(row.prompt)
            if ctx.mml is not None and prompt.num_tokens + out > ctx.mml:
                skipped += 1
                continue
        else:
            asked = out
            p, out, cut = ctx.fit(row.prompt_tokens, out)
            clipped += cut
            if out < asked:
                cut_out, asked_out = cut_out + 1, max(asked_out, asked)
            prompt, ids = ctx.synthetic(_rng(ctx.seed, ctx.stream, "jsonl", k), p)
        reqs.append(PlannedRequest(len(reqs), prompt, out, source=source, token_ids=ids))
    if not reqs:
        raise UsageError(f"{s.path}: no line fits max_model_len {ctx.mml}")
    if skipped:
        ctx.notes.append(f"{skipped} text prompts skipped: prompt + output exceeds max_model_len {ctx.mml}")
    if clipped:
        ctx.notes.append(f"{clipped} prompt_tokens lines clipped to max_model_len {ctx.mml} (prompt shortened)")
    if cut_out:
        ctx.notes.append(
            f"{cut_out} lines ask for more output tokens than max_model_len {ctx.mml} holds (up to {asked_out:,}): "
            f"their output was cut to {ctx.mml - 1:,} tokens and their prompt to 1"
        )
    if repeats:
        ctx.notes.append(f"{repeats} requests repeat a text prompt: the file has {len(lines)} lines")
    return ctx.plan(reqs)


# --- trace ------------------------------------------------------------------------------------------
# --- files ------------------------------------------------------------------------------------------


def _read_json(path: str) -> Any:
    from kvbench.core.datafiles import read_json

    return read_json(Path(path), missing=f"{path}: no such file", bad="not valid JSON")


def validated_lines(path: str, model: type[BaseModel]) -> Iterator[tuple[int, str, BaseModel]]:
    """Each non-blank line of a JSONL file as `model`: (its 1-based line number, "FILE line N", the row); a
    line that is not JSON or does not fit the model is a one-line UsageError naming it."""
    for lineno, raw in enumerate(_read_lines(path), start=1):
        if not raw.strip():
            continue
        where = f"{path} line {lineno}"
        try:
            yield lineno, where, model.model_validate(json.loads(raw))
        except json.JSONDecodeError as exc:
            raise UsageError(f"{where}: not JSON ({exc.msg})") from None
        except ValidationError as exc:
            raise UsageError(explain(exc, where, model)) from None


def _read_lines(path: str) -> Sequence[str]:
    try:
        return Path(path).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not UTF-8 text") from None
