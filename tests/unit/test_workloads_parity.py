"""Peer parity with `vllm bench serve` (issue 14): the same ShareGPT-format file read by vLLM's own dataset code,
through the same argument parser and `get_samples` call `vllm bench serve --dataset-name sharegpt` makes, and
by kvbench's `sharegpt` kind gives the same prompts and the same prompt/output token counts, request by request,
for the same seed and options; kvbench's shared-prefix shape is vLLM's prefix_repetition shape, and its uniform
lengths are vLLM's random-dataset lengths for the same seed."""

from __future__ import annotations

import importlib.util
from collections import Counter

import numpy as np
import pytest

from kvbench.core.datafiles import data_path
from kvbench.core.tokenizer import load_tokenizer
from kvbench.harness.workloads import build, parse_spec, parse_workload

# vLLM's own dataset code is the reference; no server is started.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")

SHAREGPT = data_path("workloads/sharegpt-small.json")


@pytest.fixture(scope="module")
def vllm_bench(tiny_model):
    """get_samples(argv) -> vLLM's SampleRequests for `vllm bench serve --model TINY argv...`."""
    from vllm.benchmarks.datasets import get_samples
    from vllm.benchmarks.serve import add_cli_args
    from vllm.tokenizers import get_tokenizer
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)

    def samples(*argv: str):
        args = parser.parse_args(["--model", str(tiny_model), *argv])
        tokenizer = get_tokenizer(str(tiny_model), tokenizer_mode=args.tokenizer_mode, trust_remote_code=False)
        return get_samples(args, tokenizer)

    return samples


@pytest.fixture(scope="module")
def tok(tiny_model):
    return load_tokenizer(tiny_model)


@pytest.mark.parametrize(
    "argv,table",
    [
        (["--seed", "0", "--num-prompts", "50"], {"num_requests": 50}),
        (["--seed", "7", "--num-prompts", "120"], {"num_requests": 120}),
        # More than pass the filter: vLLM oversamples with random.choice after random.seed(seed).
        (["--seed", "3", "--num-prompts", "340"], {"num_requests": 340}),
        (["--seed", "3", "--num-prompts", "340", "--no-oversample"], {"num_requests": 340, "oversample": False}),
        # --sharegpt-output-len: every request asks for it, and the min-output check is skipped (short replies pass).
        (
            ["--seed", "5", "--num-prompts", "306", "--sharegpt-output-len", "32"],
            {"num_requests": 306, "output_tokens": 32},
        ),
        (["--seed", "1", "--num-prompts", "40", "--disable-shuffle"], {"num_requests": 40, "shuffle": False}),
    ],
)
def test_sharegpt_sends_what_vllm_bench_serve_sends(vllm_bench, tok, argv, table):
    theirs = vllm_bench("--dataset-name", "sharegpt", "--dataset-path", str(SHAREGPT), *argv)
    seed = int(argv[argv.index("--seed") + 1])
    ours = build(parse_spec({"kind": "sharegpt", "path": str(SHAREGPT), **table}, "parity"), tok, seed=seed)
    assert len(ours) == len(theirs) > 0
    for r, s in zip(ours.requests, theirs, strict=False):
        assert r.prompt.content == s.prompt  # the same text, in the same order
        assert r.prompt.num_tokens == s.prompt_len
        assert r.output_tokens == s.expected_output_len
    if "--sharegpt-output-len" in argv:  # the short-reply rows vLLM's default filter drops are in
        assert len({r.source for r in ours.requests}) == 306


def test_shared_prefix_has_vllms_prefix_repetition_shape(vllm_bench):
    theirs = vllm_bench(
        "--dataset-name",
        "prefix_repetition",
        "--seed",
        "0",
        "--num-prompts",
        "24",
        "--prefix-repetition-prefix-len",
        "64",
        "--prefix-repetition-suffix-len",
        "32",
        "--prefix-repetition-num-prefixes",
        "4",
        "--prefix-repetition-output-len",
        "16",
    )
    ours = build(parse_workload("shared-prefix:groups=4,prefix=64,suffix=32,output=16,requests=24"), 512)
    # kvbench sends token ids: exactly prefix + suffix. vLLM sends decoded text, and its decode/re-encode
    # adjustment misses now and then (it logs "N more tokens than expected"): a token or two off.
    assert [r.prompt.num_tokens for r in ours.requests] == [96] * 24
    their_lens = [s.prompt_len for s in theirs]
    assert Counter(their_lens).most_common(1)[0][0] == 96 and all(abs(n - 96) <= 2 for n in their_lens)
    assert [s.expected_output_len for s in theirs] == ours.output_tokens == [16] * 24
    # vLLM's prompts are text: a group's requests start with the same decoded prefix (64 random tokens decode to
    # far more than 24 characters), other groups' do not.
    their_groups = Counter(s.prompt[:24] for s in theirs)
    our_groups = Counter(r.prefix_group for r in ours.requests)
    assert sorted(their_groups.values()) == sorted(our_groups.values()) == [6, 6, 6, 6]
    # Both shuffle: the groups are interleaved, not in blocks.
    assert [s.prompt[:24] for s in theirs][:6] != [theirs[0].prompt[:24]] * 6
    assert [r.prefix_group for r in ours.requests][:6] != [ours.requests[0].prefix_group] * 6


def test_uniform_lengths_are_vllms_random_lengths_for_the_same_seed(vllm_bench, tok):
    from vllm.benchmarks.datasets.utils import get_sampling_params

    special = tok.num_special_tokens_to_add()  # vLLM draws the text's length without these (the BOS) ...
    assert special == 1
    seed, n = 11, 64
    lens_in, lens_out, _ = get_sampling_params(np.random.default_rng(seed), n, 0.5, 300, 100, tok)
    ours = build(parse_workload(f"random:input=300,output=100,range=0.5,requests={n}"), tok, seed=seed, stream=0)
    assert [r.prompt.num_tokens for r in ours.requests] == (lens_in + special).tolist()  # ... and its engine sees them
    assert ours.output_tokens == lens_out.tolist()
    theirs = vllm_bench(
        "--dataset-name",
        "random",
        "--seed",
        str(seed),
        "--num-prompts",
        str(n),
        "--random-input-len",
        "300",
        "--random-output-len",
        "100",
        "--random-range-ratio",
        "0.5",
    )
    assert [s.expected_output_len for s in theirs] == ours.output_tokens
    # vLLM sends text and re-encodes it, which may move a length by a token or two; kvbench sends the ids.
    assert np.abs(np.array([s.prompt_len for s in theirs]) - (lens_in + special)).max() <= 2
