"""Prompts: exact lengths, reproducible, distinct per request, never special ids; chat lengths checked."""

from __future__ import annotations

import pytest

from kvbench.harness.client.backend import _SSE
from kvbench.harness.client.workload import Prompt, Workload, allowed_token_ids, make_prompts


def test_token_prompts_exact_reproducible_and_distinct():
    w = Workload(prompt_tokens=64, output_tokens=8, num_requests=50, seed=7)
    a = make_prompts(w, 300, special_ids=[0, 1, 2])
    b = make_prompts(w, 300, special_ids=[0, 1, 2])
    assert [p.content for p in a] == [p.content for p in b]
    assert all(len(p.content) == 64 and p.num_tokens == 64 and p.exact for p in a)
    assert a.exact and a.describe()["lengths_exact"]
    assert all(0 <= t < 300 and t not in (0, 1, 2) for p in a for t in p.content)
    # Distinct prompts, and distinct first 16-token blocks: the prefix cache has nothing to reuse.
    assert len({tuple(p.content[:16]) for p in a}) == 50
    other_seed = make_prompts(Workload(64, 8, 50, seed=8), 300, special_ids=[0, 1, 2])
    other_stream = make_prompts(w, 300, special_ids=[0, 1, 2], stream=1)
    assert not {tuple(p.content) for p in a} & {tuple(p.content) for p in other_seed}
    assert not {tuple(p.content) for p in a} & {tuple(p.content) for p in other_stream}
    # Prompt i does not depend on how many prompts were made.
    assert make_prompts(Workload(64, 8, 3, seed=7), 300, special_ids=[0, 1, 2])[2].content == a[2].content


def test_allowed_ids_from_a_tokenizer_drop_special_and_added(tiny_model):
    from kvbench.core.tokenizer import load_tokenizer

    tok = load_tokenizer(tiny_model)
    ids = set(allowed_token_ids(tok).tolist())
    assert not ids & set(tok.all_special_ids)
    assert max(ids) < tok.vocab_size
    prompts = make_prompts(Workload(100, 4, 5), tok)
    assert all(set(p.content) <= ids for p in prompts)


def test_chat_prompts_match_the_templated_length(tiny_model):
    from kvbench.core.tokenizer import load_tokenizer
    from kvbench.harness.client.workload import _templated_len

    tok = load_tokenizer(tiny_model)
    prompts = make_prompts(Workload(120, 4, 6, api="chat", seed=3), tiny_model)
    assert prompts.api == "chat" and prompts.exact
    for p in prompts:
        assert isinstance(p.content, str)
        # Re-measured independently: template rendered, then tokenized the way the server does.
        rendered = tok.apply_chat_template(
            [{"role": "user", "content": p.content}], add_generation_prompt=True, tokenize=False
        )
        assert (
            len(tok.encode(rendered, add_special_tokens=False)) == 120 == p.num_tokens == _templated_len(tok, p.content)
        )
    assert len({p.content for p in prompts}) == 6


def test_chat_prompt_shorter_than_the_template_is_flagged_approximate(tiny_model):
    prompts = make_prompts(Workload(3, 4, 2, api="chat"), tiny_model)
    assert not prompts.exact
    assert "approximate" in prompts.note
    assert all(p.num_tokens > 3 for p in prompts)


def test_chat_needs_a_tokenizer_and_workload_validates():
    with pytest.raises(ValueError):
        make_prompts(Workload(10, 4, 2, api="chat"), 500)
    for bad in (dict(prompt_tokens=0), dict(output_tokens=0), dict(num_requests=0), dict(api="responses")):
        with pytest.raises(ValueError):
            Workload(**{**dict(prompt_tokens=4, output_tokens=4, num_requests=1), **bad})


def test_raw_prompts_are_wrapped():
    assert Prompt.of([1, 2, 3]) == Prompt([1, 2, 3], 3, True)
    assert Prompt.of("hi") == Prompt("hi", None, False)


def test_sse_splitter_handles_split_reads_crlf_and_comments():
    stream = b': ping\n\ndata: {"a": 1}\r\n\r\ndata: {"b":\n\ndata: [DONE]\n\n'
    sse = _SSE()
    out = []
    for i in range(len(stream)):  # one byte per read: events must reassemble
        out += sse.feed(stream[i : i + 1])
    assert out == ['{"a": 1}', '{"b":', "[DONE]"]
    assert not sse.pending
