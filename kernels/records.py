"""Versioned JSON records of `kvbench kernels` and `kvbench accuracy`, beside the machine's other results:

results/<machine>/kernels/<UTC time>.json     schema kvbench.kernels/1
results/<machine>/accuracy/<UTC time>.json    schema kvbench.accuracy/1
"""

from __future__ import annotations

import os
from datetime import datetime

from kvbench.specs import machine


def environment() -> dict:
    """The harness's environment plus what kernels depend on: the torch device and the interpreter mode."""
    import torch

    env = machine.environment()
    env["cuda_runtime"] = torch.version.cuda
    env["triton_interpret"] = os.environ.get("TRITON_INTERPRET") == "1"
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env["device"] = {
            "name": props.name,
            "capability": f"{props.major}.{props.minor}",
            "sm_count": props.multi_processor_count,
            "memory_bytes": props.total_memory,
        }
    else:
        env["device"] = {"name": "cpu"}
    return env


def header(started: datetime, mode: str, shape, card) -> dict:
    """What every kernels record opens with (the default grid's and the sweep's): schema, when, where, the
    attention shape and the catalog GPU (kernels/bench: AttnShape, a gpus.toml card or None)."""
    from kvbench.kernels import bench

    return {
        "schema": bench.SCHEMA,
        "created_at": started.isoformat(timespec="seconds"),
        "machine": machine.machine_name(),
        "environment": environment(),
        "mode": mode,
        "status": "complete",
        "shape": {
            "model": shape.name,
            "num_heads": shape.num_heads,
            "num_kv_heads": shape.num_kv_heads,
            "head_dim": shape.head_dim,
            "block_size": shape.block_size,
        },
        "gpu_catalog": {"key": card.key, "name": card.name, "hbm_bandwidth_gbs": card.hbm_bandwidth_gbs}
        if card
        else None,
    }
