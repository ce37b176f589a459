"""`kvbench run --workload`: each request goes out with its own prompt and output length, a trace on its own
send times, a multi-turn workload as conversations; the record says which, and the prefix-cache numbers come
from the real server's /metrics. Fake servers for timing and shape; the shared real vLLM for the cache."""

from __future__ import annotations

import pytest
from support import kvbench, run_against

from kvbench import records


@pytest.mark.vllm
def test_shared_prefixes_hit_the_real_servers_prefix_cache(vllm_servers, tiny_model, tmp_path):
    server = vllm_servers.get("auto")
    doc, _ = run_against(
        server.base_url,
        tiny_model,
        "shared-prefix:groups=2,prefix=256,suffix=32,output=8,requests=16",
        tmp_path,
        "--no-search",
        "--concurrency",
        "2",
        child=True,
    )
    pc = doc["dtypes"][0]["phases"][-1]["prefix_cache"]
    assert pc["queries_tokens"] >= 16 * 288 * 0.9  # every prompt token was looked up ...
    assert 0.5 < pc["hit_rate"] < 1.0  # ... and most of the 2 prefixes came from the cache (first use missed)
    assert records.headline(doc["dtypes"][0])["prefix_hit_rate"] == pytest.approx(pc["hit_rate"])
    shown = kvbench("report", str(records.find_records(tmp_path)[0])).stdout
    assert f"{pc['hit_rate']:.1%}" in shown  # the report's prefix-cache table
