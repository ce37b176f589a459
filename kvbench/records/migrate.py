"""Reading `kvbench.run/1` records (one JSON with every request inside): upgraded on load to the v2 shape,
their embedded requests and /metrics snapshots kept readable as samples tables."""

from __future__ import annotations

from kvbench.records.schema import SCHEMA_V1, PhaseKind, RunStatus


def upgrade_v1(doc: dict) -> dict:
    """A kvbench.run/1 document in the v2 shape (requests stay where they were, for samples_frame)."""
    doc = dict(doc)
    doc["schema"] = SCHEMA_V1
    definitions = {}
    dtypes = []
    for d in doc.get("dtypes") or []:
        if not isinstance(d, dict):
            raise ValueError("dtypes: each entry must be an object")
        d = dict(d)
        phases = []
        for p in d.get("phases") or []:
            p = dict(p)
            name = str(p.get("name") or "")
            summary = dict(p.get("summary") or {})
            definitions = summary.pop("definitions", None) or definitions
            mode = p.get("mode") or {}
            rate = mode.get("rate_rps")
            phases.append(
                {
                    "name": name,
                    "kind": PhaseKind.SLO_PROBE if name.startswith("slo-c") else PhaseKind.FIXED,
                    "concurrency": mode.get("concurrency"),
                    "rate_rps": rate if isinstance(rate, (int, float)) else None,
                    "mode": mode,
                    "summary": summary,
                    "requests": len(p.get("requests") or []),
                }
            )
        d["phases"] = phases
        metrics = d.get("metrics") or {}
        during = metrics.get("during")
        d["metrics"] = {
            "before": metrics.get("before"),
            "after": metrics.get("after"),
            "during": len(during) if isinstance(during, list) else 0,
        }
        tel = d.get("telemetry") or {}
        samples = tel.get("samples")
        d["telemetry"] = {**tel, "samples": len(samples) if isinstance(samples, list) else 0}
        agreement = d.get("agreement")
        if isinstance(agreement, dict):
            d["agreement"] = {
                "prompts": len(agreement.get("samples") or []),
                **{k: agreement.get(k) for k in ("prompt_tokens", "tokens", "vs_auto", "error")},
            }
        server = d.get("server")
        if isinstance(server, dict):
            d["server"] = {"managed": not (doc.get("config") or {}).get("endpoint"), **server}
        d["capacity"] = d.get("capacity") or {}
        dtypes.append(d)
    doc["dtypes"] = dtypes
    doc["definitions"] = definitions
    if doc.get("status") == "running":  # a v1 run killed before it could say so
        doc["status"] = RunStatus.INTERRUPTED
    return doc


def v1_samples(doc: dict, table: str):
    """A v1 record's embedded samples as a "requests" or "series" table (v1 records had no evaluations)."""
    import pandas as pd

    return pd.DataFrame(v1_rows(doc, table))


def v1_rows(doc: dict, table: str) -> list[dict]:
    """A v1 record's embedded requests (table "requests") or /metrics snapshots ("series") as sample rows."""
    rows = []
    for d in doc.get("dtypes") or []:
        dtype = d.get("kv_cache_dtype")
        if table == "requests":
            for i, p in enumerate(d.get("phases") or []):
                name = p.get("name") or ""
                kind = PhaseKind.SLO_PROBE.value if name.startswith("slo-c") else PhaseKind.FIXED.value
                for r in p.get("requests") or []:
                    rows.append(
                        {
                            **r,
                            "run_id": doc.get("run_id"),
                            "kv_cache_dtype": dtype,
                            "phase": name,
                            "phase_kind": kind,
                            "phase_index": i,
                            "warmup": False,
                        }
                    )
        else:
            for snap in (d.get("metrics") or {}).get("during") or []:
                for name, value in (snap.get("values") or {}).items():
                    rows.append(
                        {
                            "run_id": doc.get("run_id"),
                            "kv_cache_dtype": dtype,
                            "source": "metrics",
                            "t": snap.get("t"),
                            "gpu": None,
                            "name": name,
                            "value": value,
                        }
                    )
    return rows
