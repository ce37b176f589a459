"""Which model a run served, as the pages label it: the CPU default's tiny model is "synthetic" (trained on
kvbench's own pseudo-English: its numbers cannot tell what a real model loses), a registry model is "real" with
where its weights came from (the record's model_provenance, kvbench/realmodels). Runs of different models on one
machine are shown side by side, each under its own label, never merged."""

from __future__ import annotations

from kvbench.core import tinyconfig


def model_name(doc: dict) -> str | None:
    cfg = doc.get("config") or {}
    return cfg.get("model_name") or cfg.get("model")


def model_label(doc: dict) -> str:
    """ "synthetic", "real: <weights> (<package> <version>)", or "" for a model kvbench knows nothing of."""
    if model_name(doc) == tinyconfig.NAME:
        return "synthetic"
    prov = doc.get("model_provenance") or {}
    if prov:
        return f"real: {prov.get('weights')} ({prov.get('package')} {prov.get('version')})"
    return ""


def titled(doc: dict) -> str:
    """The model's name with its label, for a heading: `smollm2-135m-instruct (real: ...)`."""
    label = model_label(doc)
    return f"{model_name(doc)} ({label})" if label else str(model_name(doc))


def label_of_run(run_id: str | None, records: list[dict]) -> str:
    doc = next((r for r in records if r.get("run_id") == run_id), None)
    return model_label(doc) if doc is not None else ""


def newest_per_machine_and_model(records: list[dict]) -> list[dict]:
    """Each (machine, model)'s newest record (records sorted by created_at): one model never hides another."""
    newest: dict[tuple[str, str], dict] = {}
    for doc in records:
        newest[(str(doc.get("machine")), str(model_name(doc)))] = doc
    return [newest[k] for k in sorted(newest)]
