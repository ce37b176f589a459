"""Cache formats: bytes per token and per page exactly as vLLM lays them out."""

import pytest

from kvbench.core.errors import UsageError
from kvbench.specs.formats import get_format, parse_format_list
from kvbench.specs.gpus import get_gpu
from kvbench.specs.models import load_model

LLAMA = load_model("llama-3.1-8b")
FULL = LLAMA.layers[0]


@pytest.mark.parametrize(
    "dtype, per_layer, bpe",
    [
        ("auto", 2 * 8 * 128 * 2, 2.0),  # 4096 B: K and V, 8 heads x 128 x 2 B
        ("fp8", 2 * 8 * 128, 1.0),
        ("fp8_e5m2", 2 * 8 * 128, 1.0),
        ("nvfp4", 2 * 8 * (64 + 8), 0.5625),  # D/2 data bytes + D/16 scale bytes per head
        ("mxfp4", 2 * 8 * (64 + 4), 0.53125),
    ],
)
def test_bytes_per_token_per_layer(dtype, per_layer, bpe):
    fmt = get_format(dtype)
    assert fmt.bytes_per_token_per_layer(LLAMA, FULL) == per_layer
    assert fmt.bytes_per_element(LLAMA) == bpe


def test_pages_match_vllm_pr_37192():
    # 16 tokens x 8 heads x d128: 65,536 B in bf16, 18,432 B in nvfp4 (K and V).
    assert 16 * get_format("auto").bytes_per_token_per_layer(LLAMA, FULL) == 65_536
    assert 16 * get_format("nvfp4").bytes_per_token_per_layer(LLAMA, FULL) == 18_432


def test_mla_caches_one_latent():
    ds = load_model("deepseek-v3")
    assert get_format("auto").bytes_per_token_per_layer(ds, ds.layers[0]) == 576 * 2
    assert get_format("fp8").bytes_per_token_per_layer(ds, ds.layers[0]) == 576
    assert "MLA" in get_format("nvfp4").unsupported_reason(ds)


def test_nvfp4_refusals_depend_on_gpu():
    oss = load_model("gpt-oss-120b")
    assert "head_size 64" in get_format("nvfp4").unsupported_reason(oss, get_gpu("h100-sxm"))
    assert get_format("nvfp4").unsupported_reason(oss, get_gpu("b200")) is None
    assert get_format("nvfp4").unsupported_reason(LLAMA, get_gpu("a100-80gb")) is None


def test_aliases_and_unknown():
    assert [f.key for f in parse_format_list("fp16,bf16,auto,fp8_e4m3,nvfp4")] == ["auto", "fp8", "nvfp4"]
    with pytest.raises(UsageError, match="choose from: .*nvfp4"):
        get_format("int3")
