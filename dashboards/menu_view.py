"""The capacity page's KV-dtype menu: every value of vLLM's --kv-cache-dtype, what its pages cost on two reference
models (kvbench's capacity model, the registry's layouts) and where vLLM serves it (the support matrix read from
vLLM's backends, kvbench/data/vllm_kv_support.json). No run record needed: it is what the registry and vLLM say."""

from __future__ import annotations

import pandas as pd

from kvbench.core.units import KiB
from kvbench.dashboards.components import dtype_chip, fmt, note, section, table
from kvbench.dashboards.theme import esc
from kvbench.specs import vllm_support
from kvbench.specs.formats import format_ratio, get_format
from kvbench.specs.models import load_model

# two reference models: dense GQA attention and DeepSeek's sparse MLA (its own page formats)
REFERENCES = (("llama-3.1-8b", "Llama-3.1-8B"), ("deepseek-v3.2", "DeepSeek-V3.2"))


def _sms(ccs: list[int]) -> str:
    return ", ".join(map(str, ccs)) if ccs else "—"


def _cost(dtype: str, model) -> tuple[str, str]:
    """(KV per token over all layers, ratio of tokens vs auto) of `dtype` on `model`, or why it has none."""
    fmt_ = get_format(dtype)
    if fmt_.unsupported_reason(model) or not vllm_support.served_anywhere(dtype, model):
        return "—", "—"
    per_token = sum(fmt_.bytes_per_token_per_layer(model, layer) for layer in model.layers)
    return fmt(per_token / KiB, 1), fmt(format_ratio(fmt_, get_format("auto"), model), 2, "x")


def menu_frame() -> pd.DataFrame:
    models = [(load_model(key), label) for key, label in REFERENCES]
    rows = []
    for row in vllm_support.support_rows():
        fmt_ = get_format(row["dtype"])
        out = {
            "dtype_html": dtype_chip(row["dtype"]),
            "format": fmt_.key,
            "dense": _sms(row["dense"]),
            "mla": _sms(sorted(set(row["mla"]) | set(row["sparse_mla"]))),
            "backends": ", ".join(f"{n} ({'/'.join(p)})" for n, p in row["backends"].items()) or "none",
        }
        for i, (model, _) in enumerate(models):
            out[f"kib{i}"], out[f"ratio{i}"] = _cost(row["dtype"], model)
        rows.append(out)
    return pd.DataFrame(rows)


def menu_section() -> str:
    """The menu table with the matrix beside it, as one page section."""
    frame = menu_frame()
    columns = {
        "dtype_html": "--kv-cache-dtype",
        "format": "kvbench format",
        **{f"kib{i}": f"{label}: KV per token (KiB)" for i, (_, label) in enumerate(REFERENCES)},
        **{f"ratio{i}": f"{label}: tokens vs auto" for i, (_, label) in enumerate(REFERENCES)},
        "dense": "CUDA SMs, attention",
        "mla": "CUDA SMs, MLA",
        "backends": "backends that list it (platform)",
    }
    numeric = {k for k in columns if k.startswith(("kib", "ratio"))}
    lead = note(
        f"vLLM {esc(vllm_support.version())} offers {len(frame)} KV-cache dtypes. Sizes: kvbench's page accounting "
        "(vLLM's spec and each backend's packing, asymmetric K/V and scales included; turboquant and ultraquant keep "
        "a dense model's first and last 2 layers at the model dtype); — where no platform of vLLM serves the dtype for "
        "that kind of model. "
        "CUDA SMs: compute capabilities on which a backend CUDA's selector tries accepts it (read from vLLM's "
        "backends: supported_kv_cache_dtypes and their capability checks). A dtype no CUDA backend takes is served "
        "on the platform named, or nowhere in vLLM itself. <code>kvbench capacity --kv-dtypes all</code> sizes each "
        "for a model and GPU."
    )
    body = table(frame, columns, raw={"dtype_html"}, numeric=numeric)
    return section("vLLM's KV-dtype menu and where it runs", lead + body, anchor="kv-dtype-menu")
