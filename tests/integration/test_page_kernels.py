"""The kernels page is honest about what drew it: which kernel variant and configuration made each line, that the
figures are kvbench's reference kernels while a target is missed, and the sweep's NVML trace and device-memory
view (or why they are missing)."""

import json
from pathlib import Path

import pandas as pd
from support import committed_results

from kvbench.dashboards import page_kernels as pk
from kvbench.dashboards.components import Page

REPO = Path(__file__).resolve().parents[2]
H200 = committed_results() / "h200-141gb" / "kernels" / "20261204T174946Z.json"
FIELDS = ["t", "gpu", "memory_used_bytes", "power_w", "sm_util_pct", "mem_util_pct", "sm_clock_mhz", "mem_clock_mhz"]
FIELDS += ["temperature_c"]


def _rows(doc):
    rows = [{"kernel": "decode", **r} for r in doc["decode"]] + [{"kernel": "write", **r} for r in doc["write"]]
    frame = pd.DataFrame(rows)
    frame["peak_gbs"], frame["copy_gbs"], frame["created_at"] = 4800.0, doc["copy_baseline"]["gbs"], doc["created_at"]
    for col in ("batch", "context", "tokens"):
        frame[col] = frame.get(col)
    return frame


def _sweep_doc():
    cfg = {"tile_n": 128, "num_warps": 8, "num_stages": 2, "dequant": "f16"}
    dec = {"format": "nvfp4", "batch": 8, "context": 32768, "variant": "full", "config": cfg, "time_us": 300.0}
    dec |= {"gbs": 1500.0, "pct_of_peak": 31.0, "pct_of_copy": 35.0}
    wr = {"format": "nvfp4", "tokens": 4096, "variant": "write", "config": {"encode": "bits", "num_warps": 2}}
    wr |= {"time_us": 30.0, "gbs": 900.0, "pct_of_peak": 19.0, "pct_of_copy": 21.0}
    samples = [[10.0 + i / 10, 0, 5e9 + i * 1e8, 300.0 + i, 80.0, 60.0, 1980.0, 3201.0, 40.0] for i in range(20)]
    phases = [
        {"name": "decode grid", "kind": "phase", "t_start": 10.0, "t_end": 12.0},
        {
            "name": "decode nvfp4 batch 8 x 32768 full (...)",
            "kind": "case",
            "t_start": 10.5,
            "t_end": 10.7,
            "gbs": 1500.0,
        },
    ]
    return {
        "_path": "results/h200-141gb/kernels/20990101T000000Z.json",
        "machine": "h200-141gb",
        "created_at": "2099-01-01T00:00:00+00:00",
        "environment": {"vllm": None},
        "mode": "gpu",
        "copy_baseline": {"gbs": 4226.0},
        "decode": [dec],
        "write": [wr],
        "ratios": [],
        "targets": {"nvfp4_decode_speedup_at_32k": {"target": 2.5, "by_batch": {"8": 1.2}, "met": {"8": False}}},
        "sweep": {"candidates": {"nvfp4": [cfg]}, "bounds": []},
        "telemetry": {"available": True, "interval_s": 0.1, "fields": FIELDS, "samples": samples, "phases": phases},
        "device_memory": {
            "available": True,
            "torch": {"total_bytes": 150_109_880_320, "free_bytes": 149_000_000_000},
            "nvml": {"available": True, "total_bytes": 150_754_820_096, "free_bytes": 149_500_000_000},
            "catalog": {"key": "h200", "device_memory_bytes": 143771 * 2**20, "torch_total_bytes": 139.81 * 2**30},
            "differences_mib": {"nvml_minus_torch_mib": 615.0},
        },
    }


def test_committed_h200_record_is_called_kvbench_reference_kernel_while_targets_are_missed():
    doc = {**json.loads(H200.read_text()), "_path": str(H200)}
    words = pk.provenance_note(doc)
    assert "as committed (one configuration, no sweep)" in words
    assert "not vLLM's" in words and "nvfp4 decode speedup at 32k (32)" in words
    assert "fp8 decode at 32K (not judged by this record) — batch 1: 0.99x" in pk.fp8_words(doc)
    page = Page("kernels", "k")
    evidence = pk.gpu_evidence(doc, page)
    assert "NVML trace: not in this record" in evidence and "Device memory: not in this record" in evidence
    fig = pk.kernel_figure(doc, _rows(doc))
    assert all(pk.AS_COMMITTED in row[7] for t in fig.data for row in t.customdata)


def test_sweep_record_names_the_candidate_of_each_point_and_draws_the_trace():
    doc = _sweep_doc()
    fig = pk.kernel_figure(doc, _rows(doc))
    hovers = {row[7] for t in fig.data for row in t.customdata}
    assert any("tile_n 128, num_warps 8, num_stages 2, dequant f16" in h for h in hovers)
    assert any("encode bits, num_warps 2" in h for h in hovers)
    assert "fastest candidate configuration" in pk.provenance_note(doc)
    trace = pk.telemetry_figure(doc)
    names = {t.name for t in trace.data}
    assert {"achieved rate per timed case", "power_w", "sm_util_pct", "temperature_c", "sm_clock_mhz"} <= names
    assert any(a.text == "decode grid" for a in trace.layout.annotations)
    mem = pk.memory_table(doc)
    assert "torch.cuda.mem_get_info" in mem and "139.80 GiB" in mem and "nvml minus torch mib +615" in mem


def test_no_gpu_sweep_says_not_collected():
    doc = {**_sweep_doc(), "mode": "interpret"}
    doc["telemetry"] = {"available": False, "reason": "no GPU: not collected (Triton interpreter on the CPU)"}
    doc["device_memory"] = dict(doc["telemetry"])
    out = pk.gpu_evidence(doc, Page("kernels", "k"))
    assert out.count("no GPU: not collected") == 2 and pk.telemetry_figure(doc) is None


def test_the_guide_states_the_committed_h200_numbers():
    doc = json.loads(H200.read_text())
    text = (REPO / "docs" / "guide" / "kernels.md").read_text()
    assert f"{doc['copy_baseline']['gbs']:,.0f} GB/s" in text
    for r in doc["ratios"]:
        if r["context"] == 32768:
            assert f"| {r['batch']} |" in text
            assert f"{r['speedup_fp8']:.2f}× | {r['speedup_nvfp4']:.2f}× |" in text
    for r in doc["decode"]:
        if r["context"] == 32768:
            assert f"{r['time_us']:,.1f} µs, {r['gbs']:,.0f} GB/s" in text
    for f, v in doc["targets"]["write_pct_of_copy"]["best_by_format"].items():
        assert f"{v:.1f}% for {f}" in text
    assert f"never exceeds {max(r['gbs'] for r in doc['decode'] if r['format'] == 'nvfp4'):,.0f} GB/s" in text
