"""The Triton kernels equal the torch reference, run by Triton's interpreter on the CPU (tiny shapes).

TRITON_INTERPRET=1 only takes effect if it is set before `triton` is first imported, and in a full
pytest session transformers or vLLM import triton first. So unless this process already interprets
(or has a GPU), a single test re-runs this file in a fresh process with TRITON_INTERPRET=1.
"""

import os
import subprocess
import sys

import pytest
import torch

HERE = os.path.abspath(__file__)
GPU = torch.cuda.is_available()
if not GPU and "triton" not in sys.modules and os.environ.get("KVBENCH_TRITON_CHILD") == "1":
    os.environ["TRITON_INTERPRET"] = "1"
RUN_HERE = GPU or os.environ.get("TRITON_INTERPRET") == "1"
here_only = pytest.mark.skipif(not RUN_HERE, reason="runs in the TRITON_INTERPRET=1 child process")
DEVICE = "cuda" if GPU else "cpu"


@pytest.mark.skipif(RUN_HERE, reason="this process runs the kernel tests itself")
def test_kernels_under_the_triton_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1", "KVBENCH_TRITON_CHILD": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", HERE, "-q", "-p", "no:cacheprovider", "-x"],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    summary = out.stdout.strip().splitlines()[-1]
    assert "failed" not in summary and "error" not in summary and int(summary.split(" passed")[0].split()[-1]) >= 20, (
        summary
    )


if RUN_HERE:
    import triton
    import triton.language as tl

    from kvbench.kernels import decode_attention as da
    from kvbench.kernels import nvfp4
    from kvbench.kernels import paged_cache as pc

    @triton.jit
    def _codec_kernel(x_ptr, b_ptr, e4_ptr, e5_ptr, e2_ptr, dec_ptr, N: tl.constexpr, MODE: tl.constexpr):
        offs = tl.arange(0, N)
        x = tl.load(x_ptr + offs)
        tl.store(e4_ptr + offs, pc.e4m3_encode(x))
        tl.store(e5_ptr + offs, pc.e5m2_encode(x))
        tl.store(e2_ptr + offs, pc.e2m1_encode_tl(x).to(tl.uint8))
        tl.store(dec_ptr + offs, pc.e4m3_decode(tl.load(b_ptr + offs), MODE))

    def _codec(x, mode=0):
        n = x.numel()
        b = torch.arange(n, dtype=torch.int64).remainder(256).to(torch.uint8).to(x.device)
        e4, e5, e2 = (torch.empty(n, dtype=torch.uint8, device=x.device) for _ in range(3))
        dec = torch.empty(n, dtype=torch.float32, device=x.device)
        _codec_kernel[(1,)](x, b, e4, e5, e2, dec, N=n, MODE=mode)
        return b, e4, e5, e2, dec


def fp32_specials():
    """Every E4M3 and E5M2 value, the midpoints between neighbours (ties), and a spread of magnitudes."""
    e4 = torch.arange(256, dtype=torch.uint8)
    e4 = e4[(e4 & 0x7F) != 0x7F].view(torch.float8_e4m3fn).float()
    e5 = torch.arange(256, dtype=torch.uint8)
    e5 = e5[(e5 & 0x7C) != 0x7C].view(torch.float8_e5m2).float()
    vals = []
    for grid in (e4, e5):
        pos = grid[grid >= 0].unique().sort().values
        vals += [pos, (pos[1:] + pos[:-1]) / 2]
    g = torch.Generator().manual_seed(0)
    vals.append(torch.randn(2048, generator=g) * torch.logspace(-6, 5, 2048))
    x = torch.cat(vals)
    x = torch.cat((x, -x, torch.tensor([1e6, -1e6, 500.0, 7e4])))
    pad = 8192 - x.numel()
    return torch.cat((x, torch.zeros(pad)))


@here_only
def test_fp8_and_e2m1_encoders_match_torch_bit_for_bit():
    x = fp32_specials().to(DEVICE)
    _, e4, e5, e2, _ = _codec(x)
    assert torch.equal(e4.cpu(), x.cpu().clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8))
    assert torch.equal(e5.cpu(), x.cpu().clamp(-57344, 57344).to(torch.float8_e5m2).view(torch.uint8))
    assert torch.equal(e2.cpu(), nvfp4.e2m1_encode(x.cpu()))


@here_only
@pytest.mark.parametrize("mode", [0, 1, 2], ids=["integer", "fp8e4nv", "fp8e4b15x256"])
def test_e4m3_decode_modes_are_exact_for_every_finite_code(mode):
    if GPU and mode == 1 and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8e4nv needs sm_89")
    b, *_, dec = _codec(torch.zeros(256, device=DEVICE), mode)
    finite = (b.cpu() & 0x7F) != 0x7F
    assert torch.equal(dec.cpu()[finite], b.cpu()[finite].view(torch.float8_e4m3fn).float())


def _scales(fmt, x):
    if fmt == "nvfp4":
        return nvfp4.amax_global_scale(x)
    if fmt == "fp8":
        return float(x.abs().max()) / 448
    return 1.0


@here_only
@pytest.mark.parametrize("fmt", ["fp16", "bf16", "fp8", "fp8_e5m2", "nvfp4"])
@pytest.mark.parametrize("static_scale", [False, True], ids=["amax-scale", "scale-1"])
def test_reshape_and_cache_writes_the_reference_bytes(fmt, static_scale):
    h, d, t, pages, n = 3, 32, 4, 8, 13
    g = torch.Generator().manual_seed(1)
    dt = torch.bfloat16 if fmt == "bf16" else torch.float16  # the interpreter truncates fp32->bf16
    k = (torch.randn(n, h, d, generator=g) * 4).to(dt)
    v = torch.randn(n, h, d, generator=g).to(dt)
    k[2, 1, :16] = 0  # a zero block
    slots = torch.randperm(pages * t, generator=g)[:n]
    slots[5] = -1  # padding token: not written
    ks, vs = (1.0, 1.0) if static_scale else (_scales(fmt, k.float()), _scales(fmt, v.float()))
    ref = pc.allocate(fmt, pages, h, d, t, k_scale=ks, v_scale=vs)
    pc.write_reference(ref, k, v, slots)
    tri = pc.allocate(fmt, pages, h, d, t, k_scale=ks, v_scale=vs, device=DEVICE)
    tri.cache.fill_(0)
    pc.reshape_and_cache(tri, k.to(DEVICE), v.to(DEVICE), slots.to(DEVICE))
    assert torch.equal(tri.cache.cpu().view(torch.uint8), ref.cache.view(torch.uint8))


def _fill(fmt, seq_lens, hkv, d, t, dt, k_scale=1.0, v_scale=1.0, outlier=False):
    """A cache holding random K/V for each sequence, pages shuffled across sequences."""
    g = torch.Generator().manual_seed(2)
    pages_per = [-(-int(s) // t) for s in seq_lens]
    max_pages = max(pages_per)
    perm = torch.randperm(len(seq_lens) * max_pages, generator=g)
    bt = perm.reshape(len(seq_lens), max_pages).to(torch.int32)
    c = pc.allocate(fmt, len(seq_lens) * max_pages, hkv, d, t, k_scale=k_scale, v_scale=v_scale)
    for i, s in enumerate(seq_lens):
        pos = torch.arange(int(s))
        k = torch.randn(int(s), hkv, d, generator=g)
        if outlier:
            k[..., 5] *= 10  # an outlier channel, as real keys have
        v = torch.randn(int(s), hkv, d, generator=g)
        pc.write_reference(c, k.to(dt), v.to(dt), bt[i, pos // t].long() * t + pos % t)
    return c, bt


@here_only
@pytest.mark.parametrize(
    "fmt, qdt",
    [
        ("fp16", torch.float16),
        ("bf16", torch.bfloat16),
        ("fp8", torch.float16),
        ("fp8", torch.bfloat16),
        ("fp8_e5m2", torch.float16),
        ("nvfp4", torch.float16),
        ("nvfp4", torch.bfloat16),
    ],
)
def test_decode_attention_equals_reference(fmt, qdt):
    hkv, group, d, t = 2, 3, 32, 4
    seq_lens = torch.tensor([1, 9, 40], dtype=torch.int32)  # one token, a partial page, several partitions
    scales = {"fp8": (0.02, 0.01), "nvfp4": (0.5, 0.25)}.get(fmt, (1.0, 1.0))
    c, bt = _fill(fmt, seq_lens, hkv, d, t, qdt, *scales, outlier=True)
    q = torch.randn(len(seq_lens), hkv * group, d, generator=torch.Generator().manual_seed(3)).to(qdt)
    ref = da.decode_attention_reference(q, c, bt, seq_lens)
    c.cache = c.cache.to(DEVICE)
    out = da.decode_attention(
        q.to(DEVICE), c, bt.to(DEVICE), seq_lens.to(DEVICE), out_dtype=torch.float32, tile_n=16, partition=16
    )
    err = float((out.cpu() - ref).abs().max() / ref.abs().max())
    assert err < da.TOLERANCE[str(qdt).removeprefix("torch.")], err


@here_only
@pytest.mark.parametrize("mode", [0, 1, 2])
def test_decode_attention_fp8_decode_modes_agree(mode):
    if GPU and mode == 1 and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8e4nv needs sm_89")
    seq_lens = torch.tensor([20], dtype=torch.int32)
    c, bt = _fill("nvfp4", seq_lens, 1, 32, 4, torch.float16)
    c.cache = c.cache.to(DEVICE)
    q = torch.randn(1, 2, 32).half().to(DEVICE)
    args = (q, c, bt.to(DEVICE), seq_lens.to(DEVICE))
    base = da.decode_attention(*args, out_dtype=torch.float32, tile_n=16, fp8_decode=0)
    assert torch.equal(da.decode_attention(*args, out_dtype=torch.float32, tile_n=16, fp8_decode=mode), base)


@here_only
def test_kernels_end_to_end_write_then_read():
    """Triton write + Triton read equals reference write + reference attention (the cache path vLLM runs)."""
    hkv, group, d, t = 2, 2, 32, 4
    n = 24
    g = torch.Generator().manual_seed(4)
    k = torch.randn(n, hkv, d, generator=g).half()
    v = torch.randn(n, hkv, d, generator=g).half()
    q = torch.randn(1, hkv * group, d, generator=g).half()
    bt = torch.randperm(n // t, generator=g).to(torch.int32)[None]
    slots = bt[0, torch.arange(n) // t].long() * t + torch.arange(n) % t
    seq = torch.tensor([n], dtype=torch.int32)
    c = pc.allocate("nvfp4", n // t, hkv, d, t, k_scale=nvfp4.amax_global_scale(k.float()), device=DEVICE)
    pc.reshape_and_cache(c, k.to(DEVICE), v.to(DEVICE), slots.to(DEVICE))
    out = da.decode_attention(q.to(DEVICE), c, bt.to(DEVICE), seq.to(DEVICE), out_dtype=torch.float32, tile_n=16)
    c.cache = c.cache.cpu()
    ref = da.decode_attention_reference(q, c, bt, seq)
    assert float((out.cpu() - ref).abs().max() / ref.abs().max()) < da.TOLERANCE["float16"]
    # and the quantized attention is close to, but not equal to, full-precision attention
    exact = torch.softmax(
        (q.float()[0].reshape(hkv, group, d) @ k.float().permute(1, 2, 0)) / d**0.5, -1
    ) @ v.float().transpose(0, 1)
    rel = float((ref[0] - exact.reshape(-1, d)).norm() / exact.norm())
    assert 0.01 < rel < 0.3


@here_only
@pytest.mark.parametrize("fmt", ["fp16", "bf16", "fp8", "nvfp4"])
def test_cost_variants_and_f16_dequant_equal_their_references(fmt):
    """The sweep's variants: load-only and dequantize-only write what kernels/variants.py says, and the
    candidate f16 NVFP4 dequantization gives the attention the f32 path gives (both are exact)."""
    from kvbench.kernels import variants as va

    hkv, group, d, t = 2, 3, 32, 4
    seq_lens = torch.tensor([1, 9, 40], dtype=torch.int32)
    qdt = torch.bfloat16 if fmt == "bf16" else torch.float16
    scales = {"fp8": (0.02, 0.01), "nvfp4": (0.5, 0.25)}.get(fmt, (1.0, 1.0))
    c, bt = _fill(fmt, seq_lens, hkv, d, t, qdt, *scales, outlier=True)
    q = torch.randn(len(seq_lens), hkv * group, d, generator=torch.Generator().manual_seed(3)).to(qdt)
    ref = da.decode_attention_reference(q, c, bt, seq_lens)
    c.cache = c.cache.to(DEVICE)
    args = (q.to(DEVICE), c, bt.to(DEVICE), seq_lens.to(DEVICE))
    kw = {"out_dtype": torch.float32, "tile_n": 16, "partition": 16}
    for deq in ("f32", "f16") if fmt == "nvfp4" else ("f32",):
        for mma in da.MMA:  # tensor cores, and the candidate broadcast multiply-sum
            out = da.decode_attention(*args, dequant=deq, mma=mma, **kw)
            assert float((out.cpu() - ref).abs().max() / ref.abs().max()) < da.TOLERANCE[str(qdt)[6:]], (deq, mma)
        for variant in ("load_only", "dequant_only"):
            got = da.decode_attention(*args, dequant=deq, variant=variant, **kw)
            expect = va.variant_reference(variant, c, bt, seq_lens, hkv * group)
            assert va.max_rel_err(got, expect) < va.TOLERANCE[variant], (deq, variant)
    with pytest.raises(ValueError, match="choose from full, load_only, dequant_only / f32, f16 / dot, fma"):
        da.decode_attention(*args, variant="skip")


if RUN_HERE:

    @triton.jit
    def _encode_bits_kernel(x_ptr, out_ptr, N: tl.constexpr):
        offs = tl.arange(0, N)
        tl.store(out_ptr + offs, pc.e2m1_encode_bits(tl.load(x_ptr + offs)).to(tl.uint8))


@here_only
def test_bit_trick_e2m1_encoder_matches_torch_bit_for_bit():
    grid = torch.tensor(nvfp4.E2M1_VALUES)
    x = torch.cat((fp32_specials(), (grid[1:] + grid[:-1]) / 2, grid, torch.tensor([6.5, 7.0, 1e30])))
    x = torch.cat((x, -x))
    x = torch.cat((x, torch.zeros(triton.next_power_of_2(x.numel()) - x.numel()))).to(DEVICE)
    out = torch.empty(x.numel(), dtype=torch.uint8, device=DEVICE)
    _encode_bits_kernel[(1,)](x, out, N=x.numel())
    assert torch.equal(out.cpu(), nvfp4.e2m1_encode(x.cpu()))


@here_only
@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_bit_trick_encode_writes_the_reference_bytes(fmt):
    h, d, t, pages, n = 3, 32, 4, 8, 13
    g = torch.Generator().manual_seed(1)
    k, v = (torch.randn(n, h, d, generator=g) * 4).half(), torch.randn(n, h, d, generator=g).half()
    slots = torch.randperm(pages * t, generator=g)[:n]
    ks, vs = _scales(fmt, k.float()), _scales(fmt, v.float())
    ref = pc.allocate(fmt, pages, h, d, t, k_scale=ks, v_scale=vs)
    pc.write_reference(ref, k, v, slots)
    tri = pc.allocate(fmt, pages, h, d, t, k_scale=ks, v_scale=vs, device=DEVICE)
    pc.reshape_and_cache(tri, k.to(DEVICE), v.to(DEVICE), slots.to(DEVICE), encode="bits", num_warps=2)
    assert torch.equal(tri.cache.cpu().view(torch.uint8), ref.cache.view(torch.uint8))
