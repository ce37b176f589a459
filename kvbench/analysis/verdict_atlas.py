"""The atlas: every KV dtype of one run (`kvbench run --kv-dtypes all`) as one table sorted by capacity, the
trade-off a user picks from. Per dtype: how it was served (native, emulated by kvbench's CPU backend, refused
with the reason, failed), the engine's KV tokens and its gain over auto, whether kvbench's capacity model
predicted the engine's tokens exactly, its accuracy verdict, its mean KLD at rest with the 95% interval and
top-token agreement (fidelity per token), and where its scales came from. Built from kvbench.analysis.verdict.decide's
Decision (the one recommendation over all of them), never judged again here; `kvbench report` and the dashboard's
Atlas page show the same rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.analysis import verdict_accuracy as acc
from kvbench.analysis.verdict_table import short_reason
from kvbench.records import DtypeStatus, RunRecord
from kvbench.specs.formats import order_key, tracked_dtypes

NATIVE, EMULATED, REFUSED, FAILED = "native", "emulated", "refused", "failed"


@dataclass(frozen=True)
class AtlasRow:
    dtype: str
    served: str  # NATIVE / EMULATED / REFUSED / FAILED
    engine_tokens: int | None  # what vLLM said it allocated
    model_tokens: int | None  # kvbench's capacity model for the engine's own budget, block size and context
    gain: float | None  # engine tokens over auto's
    verdict: str  # the decision's status (accuracy state)
    status: str  # the decision's status alone: recommended / eligible / excluded / not ranked
    kld: float | None  # mean KLD at rest, nats per token
    kld_ci: tuple[float, float] | None
    top1: float | None  # top-token agreement at rest
    scales: str | None  # "unit", "checkpoint", "dynamic", "none", with the variant where one was asked
    reason: str  # the refusal or failure, else the verdict's short reason

    @property
    def model_matches(self) -> bool | None:
        """The capacity model predicted the engine's tokens exactly (None where either is missing)."""
        if self.engine_tokens is None or self.model_tokens is None:
            return None
        return self.engine_tokens == self.model_tokens


def is_atlas(record: RunRecord) -> bool:
    """A run beyond the tracked dtypes (more dtypes, or a --kv-scales variant): the one its atlas is shown for."""
    names = [d.kv_cache_dtype for d in record.dtypes]
    return any("@" in n for n in names) or len(set(names) - set(tracked_dtypes())) > 0


def rows(record: RunRecord, decision) -> list[AtlasRow]:
    """One row per dtype, the most KV tokens first; refused and failed dtypes last, in the registry's order."""
    auto = record.dtype(acc.REFERENCE)
    base = auto.capacity.engine.kv_tokens if auto is not None and auto.capacity.engine else None
    out = []
    for d in record.dtypes:
        v = decision.dtypes.get(d.kv_cache_dtype)
        engine = d.capacity.engine.kv_tokens if d.capacity.engine else None
        model = d.capacity.model.kv_tokens if d.capacity.model else None
        rest = (d.fidelity or {}).get("rest") or {}
        ci = rest.get("mean_kld_ci")
        scales = d.scales or {}
        variant = scales.get("variant")
        if d.status == DtypeStatus.UNSUPPORTED:
            served, reason = REFUSED, d.error or "refused"
        elif d.status == DtypeStatus.FAILED and d.server is None and d.error and "failed to start" in d.error:
            served, reason = REFUSED, f"vLLM did not start it: {d.error}"  # its own reason, from its log
        elif d.status == DtypeStatus.FAILED:
            served, reason = FAILED, d.error or "failed"
        else:
            served = EMULATED if d.emulated else NATIVE
            reason = short_reason(v, decision) if v is not None else ""
            if engine and engine == base and d.kv_cache_dtype != acc.REFERENCE and _boundary(d.kv_cache_dtype):
                reason = "vLLM keeps its first and last layers at auto: all of this model's; " + reason
        out.append(
            AtlasRow(
                dtype=d.kv_cache_dtype,
                served=served,
                engine_tokens=engine,
                model_tokens=model,
                gain=engine / base if engine and base else None,
                verdict=f"{v.status} ({v.accuracy.state})" if v is not None else "—",
                status=v.status if v is not None else "—",
                kld=rest.get("mean_kld"),
                kld_ci=(ci[0], ci[1]) if ci and len(ci) == 2 and None not in ci else None,
                top1=rest.get("top1_agreement"),
                scales=(
                    None
                    if not scales
                    else scales.get("source") + (f" ({variant})" if variant and variant != "checkpoint" else "")
                ),
                reason=reason,
            )
        )
    measured = sorted(
        (r for r in out if r.served in (NATIVE, EMULATED)),
        key=lambda r: (-(r.gain or 0.0), order_key(r.dtype)),
    )
    others = sorted((r for r in out if r.served not in (NATIVE, EMULATED)), key=lambda r: order_key(r.dtype))
    return measured + others


def _boundary(dtype: str) -> int:
    """Layers at each end vLLM keeps at the model dtype for this dtype (turboquant, ultraquant), 0 for others."""
    from kvbench.core.errors import UsageError
    from kvbench.specs.formats import get_format

    try:
        return get_format(dtype.split("@", 1)[0]).native_boundary_layers
    except UsageError:
        return 0
