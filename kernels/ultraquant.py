"""UltraQuant 4-bit KV cache (vLLM 0.32's ultraquant_4bit), kvbench's own torch store.

vLLM writes it with `ultraquant_store` (vllm/v1/attention/ops/ultraquant/triton_store.py) and describes it in
`ultraquant/format.py` and a torch reference (`ultraquant/reference.py`). Per (token, head):

- K is Hadamard-rotated in fp32 by the store kernel's butterfly: log2(D) stages, each
  (sign * x + partner) * 0.7071067811865476 (fp32 rounding at every stage, which is not bit-identical to the
  reference's x @ H.T: see docs/guide/emulated-dtypes.md). V is not rotated.
- Per group of 32 values: s = 2^floor(log2(0.156 * absmax) + 0.5), one UE8M0 byte (exponent + 127; 0 for an
  all-zero group); each value's FP4 E2M1 code is its nearest level of x / s (a tie goes to the lower level:
  the kernel counts midpoints strictly below), two codes per byte, even element in the low nibble.
- Decoding: code * s; keys are rotated back (H is orthonormal and symmetric).

Slot layout (format.py): [K codes D/2 | K scales D/32 | V codes D/2 | V scales D/32] per (token, KV head).
"""

from __future__ import annotations

import torch

from kvbench.kernels import codecs
from kvbench.kernels.nvfp4 import e2m1_decode, pack_nibbles, unpack_nibbles

GROUP = 32
C = 0.156  # format.py DEFAULT_CONSTANT_C: s_raw = c * absmax
UE8M0_BIAS = 127
INV_SQRT2 = 0.7071067811865476
# The 15 FP4 levels in order and the midpoints between them; code of level i (sorted) is SORTED_TO_BITS[i].
LEVELS = (-6.0, -4.0, -3.0, -2.0, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
MIDPOINTS = tuple((a + b) / 2 for a, b in zip(LEVELS, LEVELS[1:], strict=False))


def page_layout(d: int) -> codecs.PageLayout:
    if d % GROUP or (d & (d - 1)):
        raise ValueError(f"ultraquant_4bit needs a power-of-two head size, a multiple of {GROUP}; got {d}")
    side = d // 2 + d // GROUP
    return codecs.PageLayout(k_bytes=side, v_bytes=side)


def rotate(x: torch.Tensor) -> torch.Tensor:
    """The store kernel's Walsh-Hadamard butterfly, normalised by 1/sqrt(2) per stage, fp32."""
    x = x.float()
    d = x.shape[-1]
    idx = torch.arange(d)
    stage = 1
    while stage < d:
        sign = torch.where((idx & stage) == 0, 1.0, -1.0)
        x = (sign * x + x[..., idx ^ stage]) * INV_SQRT2
        stage *= 2
    return x


def unrotate(x: torch.Tensor) -> torch.Tensor:
    return rotate(x)  # H/sqrt(D) is symmetric and orthonormal: its own inverse


def encode(x: torch.Tensor) -> torch.Tensor:
    """uint8 [..., D/2 + D/32]: packed codes, then the group scale bytes, of x [..., D] (already rotated for K)."""
    d = x.shape[-1]
    g = x.float().reshape(*x.shape[:-1], d // GROUP, GROUP)
    absmax = g.abs().amax(-1)
    zero = absmax == 0
    exp = torch.floor(torch.log2(torch.where(zero, 1.0, absmax * C)) + 0.5).to(torch.int32)
    s = torch.where(zero, 1.0, torch.exp2(exp.float()))
    sorted_idx = ((g / s.unsqueeze(-1)).unsqueeze(-1) > torch.tensor(MIDPOINTS, dtype=torch.float32)).sum(
        -1, dtype=torch.int32
    )
    sorted_idx = torch.where(zero.unsqueeze(-1), 7, sorted_idx)
    bits = torch.where(sorted_idx < 7, 15 - sorted_idx, sorted_idx - 7).to(torch.uint8)
    byte = torch.where(zero, 0, exp + UE8M0_BIAS)
    byte = torch.where((byte < 0) | (byte > 255), 0, byte).to(torch.uint8)
    return torch.cat((pack_nibbles(bits.flatten(-2)), byte), dim=-1)


def decode(data: torch.Tensor, d: int) -> torch.Tensor:
    """float32 [..., D] of one side's bytes (rotated basis for K)."""
    codes = unpack_nibbles(data[..., : d // 2])
    byte = data[..., d // 2 :].to(torch.int32)
    s = torch.where(byte == 0, 0.0, torch.exp2((byte - UE8M0_BIAS).float()))
    vals = e2m1_decode(codes).reshape(*codes.shape[:-1], d // GROUP, GROUP)
    return (vals * s.unsqueeze(-1)).flatten(-2)


def round_trip_k(x: torch.Tensor) -> torch.Tensor:
    return unrotate(decode(encode(rotate(x)), x.shape[-1]))


def round_trip_v(x: torch.Tensor) -> torch.Tensor:
    return decode(encode(x), x.shape[-1])


def _encode_rows(k, v, scales):
    return torch.cat((encode(rotate(k)), encode(v)), dim=-1)


def decode_rows_rotated(rows: torch.Tensor, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(K in the rotated basis, V), float32 [..., D]."""
    half = rows.shape[-1] // 2
    return decode(rows[..., :half], d), decode(rows[..., half:], d)


def _decode_rows(rows, head_size, scales):
    k_rot, v = decode_rows_rotated(rows, head_size)
    return unrotate(k_rot), v


_store, _decode = codecs.row_codec_io(_encode_rows, _decode_rows)
CODEC = codecs.register(
    codecs.Codec(
        key="ultraquant_4bit",
        quant_dequant=round_trip_k,
        quant_dequant_v=round_trip_v,
        scaled=False,
        vllm_dtype="ultraquant_4bit",
        layout=page_layout,
        store=_store,
        decode=_decode,
        notes={
            "stores": "FP4 E2M1 codes + one power-of-two (UE8M0) scale per 32 values; keys Hadamard-rotated",
            "oracle": "vLLM's ultraquant_store under TRITON_INTERPRET=1 and ultraquant/reference.py "
            "(tests/integration/test_bitexact_vllm.py)",
        },
    )
)
