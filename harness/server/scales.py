"""Each dtype's KV scales in a run: where they came from (kvbench/core/kvscales.py's sources), read from the checkpoint
the server loaded and from vLLM's own start-up lines, and which variants a run serves (--kv-scales).

A dtype's source follows from what vLLM 0.32 does with it (kvbench/core/kvscales.py has the file and function):
- `none`: not quantized (auto, bfloat16, float16);
- `dynamic`: computed per token and head (per-token-head dtypes), or per vector / block and kept in the page
  (turboquant, ultraquant, the MLA formats): the registry's codec takes no tensor scale;
- `checkpoint`: a tensor-scaled dtype (fp8, fp8_e5m2, nvfp4, nvfp4_4over6, ...) served from a checkpoint whose
  quantization_config gives attention a KV-cache method and which holds k_scale / v_scale tensors;
- `unit`: a tensor-scaled dtype otherwise: vLLM's 1.0.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.core import kvscales
from kvbench.core.errors import UsageError
from kvbench.specs.formats import get_format


def takes_tensor_scale(dtype: str) -> bool | None:
    """True: vLLM scales the dtype's cache by one k_scale / v_scale per layer (read from a checkpoint, else 1.0);
    False: its scales are computed as tokens are written; None: not quantized."""
    try:
        fmt = get_format(kvscales.base_dtype(dtype))
    except UsageError:
        return None
    if fmt.key == "auto":
        return None
    from kvbench.kernels import codecs

    try:
        return codecs.get(fmt.key).scaled
    except ValueError:  # no numerics in kvbench: a fixed MLA page carries its own scales; else one per tensor
        return not fmt.mla_bytes_per_token


def convention(dtype: str) -> str | None:
    """The tensor-scale convention a calibrated scale follows for a dtype ("fp8", "fp8_e5m2", "nvfp4"): the
    registry entry whose codec calibrates it. None where the dtype takes no tensor scale."""
    if not takes_tensor_scale(dtype):
        return None
    return get_format(kvscales.base_dtype(dtype)).key


def calibratable(dtype: str) -> bool:
    """kvbench can calibrate the dtype's tensor scale: its registry codec has a calibration convention."""
    conv = convention(dtype)
    if conv is None:
        return False
    from kvbench.kernels import codecs

    try:
        return codecs.get(conv).calibrated_scale is not None
    except ValueError:
        return False


@dataclass(frozen=True)
class Served:
    """One dtype label of a run: the vLLM cache dtype, its scales variant, the folder its server loads."""

    label: str
    dtype: str
    variant: str  # kvscales.VARIANTS
    folder: str | None  # None: the run's own model (or an --endpoint's)


def expand(dtypes: list[str], variants: list[str] | None) -> list[tuple[str, str, str]]:
    """(label, dtype, variant) of each server a run starts: every dtype once, and a tensor-scaled one once per
    variant asked (--kv-scales); a dtype whose scales vLLM computes itself (or none) runs once, as given."""
    variants = variants or ["checkpoint"]
    out = []
    for dtype in dtypes:
        mine = variants if takes_tensor_scale(dtype) else ["checkpoint"]
        if not calibratable(dtype):  # no codec of kvbench's to calibrate it with (fp8_inc): as given only
            mine = [v for v in mine if v != "calibrated"] or ["checkpoint"]
        for v in mine:
            out.append((kvscales.label(dtype, v), dtype, v))
    return out


def block(label: str, folder: str | None, log_lines: list[str] | None, calibration: dict | None = None) -> dict:
    """The record's `scales` for one dtype: its variant, where its scales came from and why, the checkpoint's
    k/v scales where it has any, vLLM's own lines about them, and what is wrong with them."""
    dtype = kvscales.base_dtype(label)
    variant = kvscales.variant_of(label) or "checkpoint"
    scaled = takes_tensor_scale(dtype)
    out: dict = {"variant": variant, "source": None, "why": None, "checkpoint": None, "log": [], "problems": []}
    if log_lines is not None:
        out["log"] = kvscales.log_evidence(log_lines)
    ck = None
    if folder is not None:
        try:
            ck = kvscales.read_checkpoint(folder)
        except (OSError, ValueError) as exc:  # a checkpoint kvbench cannot read: said, the run goes on
            out["problems"].append(f"checkpoint scales not read: {exc}")
    if ck is not None and (ck.has_scales or ck.kv_method):
        out["checkpoint"] = ck.summary()
    if scaled is None:
        out["source"], out["why"] = kvscales.NONE, "not quantized"
    elif scaled is False:
        out["source"] = kvscales.DYNAMIC
        out["why"] = "computed as each token is written (per token and head, or per vector/block in the page)"
    elif ck is not None and ck.kv_method and ck.has_scales:
        out["source"] = kvscales.CHECKPOINT
        out["why"] = f"the checkpoint's k_scale/v_scale, loaded through {ck.kv_method}"
        out["problems"] += ck.problems
    else:
        out["source"] = kvscales.UNIT
        if ck is None:
            out["why"] = "vLLM's 1.0 (the served checkpoint was not read: no local folder)"
        elif ck.has_scales:
            out["why"] = "vLLM's 1.0: the checkpoint's scale tensors have no KV-cache method to load them"
        else:
            out["why"] = "vLLM's 1.0: the checkpoint carries no k_scale/v_scale"
        if ck is not None:
            out["problems"] += ck.problems
    if calibration is not None:
        out["calibration"] = calibration
    return out


def served_folder(plan, label: str, reporter=None) -> str:
    """The folder a label's server loads: the run's model, or for a variant its copy (kvbench's calibrated one,
    made once and cached; the model without its scales for `unit`)."""
    from kvbench.core.datafiles import cache_root
    from kvbench.harness.server import kvcalibrate

    variant = kvscales.variant_of(label)
    if variant is None:
        return plan.model
    dtype = kvscales.base_dtype(label)
    if variant == "calibrated":
        conv = convention(dtype)
        if reporter is not None:
            reporter.phase(
                label, f"calibrating {conv} KV scales on held-out items ({', '.join(plan.calibration_tasks)})"
            )
        folder, _ = kvcalibrate.calibrated(plan.model, plan.calibration_tasks, conv, cache_root() / "kvscales")
        return str(folder)
    if variant == "unit":
        return str(kvcalibrate.unscaled(plan.model, cache_root() / "kvscales"))
    return plan.model


def calibration_of(folder: str | None) -> dict | None:
    """The calibration record kvbench wrote beside a calibrated copy (None for any other folder)."""
    import json
    from pathlib import Path

    if folder is None:
        return None
    meta = Path(folder) / "kvbench_calibration.json"
    return json.loads(meta.read_text()) if meta.is_file() else None


def plan_variants(variants: list[str] | None, model: str, dtypes: list[str], unsupported: dict, emulated: dict):
    """--kv-scales at plan time: (labels, unsupported, emulated) with each tensor-scaled dtype once per variant,
    labelled dtype@variant, the per-dtype plans following the label. `unit` on a model without scales is the model
    as given (one server); `calibrated` needs an unquantized checkpoint on disk (one-line refusal otherwise)."""
    from pathlib import Path

    if not variants or variants == ["checkpoint"]:
        return dtypes, unsupported, emulated
    folder = Path(model).expanduser()
    ck = kvscales.read_checkpoint(folder) if folder.is_dir() else None
    mine = [v for v in variants if v != "unit" or (ck is not None and ck.has_scales)]
    if "unit" in variants and "checkpoint" not in mine:
        mine.insert(0, "checkpoint")  # a model without scales, as given, is the unit variant
    if "calibrated" in mine:
        if ck is None:
            raise UsageError(f"--kv-scales calibrated needs the model on disk (a folder), not {model!r}")
        if ck.quant_method:
            raise UsageError(
                f"--kv-scales calibrated: {model} is already quantized ({ck.quant_method}); kvbench calibrates "
                "unquantized checkpoints only"
            )
    base = {label: dtype for label, dtype, _ in expand(dtypes, mine)}
    unsupported = {label: unsupported[d] for label, d in base.items() if d in unsupported}
    emulated = {label: emulated[d] for label, d in base.items() if d in emulated}
    return list(base), unsupported, emulated


def calibration_tasks(labels: list[str], tasks: list[str], backend_tasks: list[str]) -> list[str]:
    """The tasks whose held-out items calibrate a `calibrated` variant (harness/server/kvcalibrate.py): the run's own
    kvbench tasks, else the backend's (those that fit the run); none without such a variant."""
    from kvbench.specs import evaltasks

    if not any(kvscales.variant_of(label) == "calibrated" for label in labels):
        return []
    own = [t for t in tasks if t.startswith(evaltasks.PREFIX)]
    own = own or [t for t in backend_tasks if t.startswith(evaltasks.PREFIX)]
    if not own:
        raise UsageError(
            "--kv-scales calibrated measures K/V on held-out items of kvbench's own tasks; give --eval-tasks "
            "kvbench_... (e.g. kvbench_needle_512)"
        )
    return own
