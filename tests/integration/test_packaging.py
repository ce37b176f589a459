"""kvbench's kernels/ folder must never pass for Hugging Face's `kernels` package."""

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

PROBE = """
import importlib.util, json
from transformers.utils.import_utils import is_kernels_available
import kvbench.kernels
print(json.dumps({"hub": is_kernels_available(), "spec": importlib.util.find_spec("kernels") is not None,
                  "ours": kvbench.kernels.__name__}))
"""


@pytest.mark.parametrize("cwd", ["outside", "repo"])
def test_transformers_kernel_hub_check_stays_false(cwd, tmp_path):
    pytest.importorskip("transformers")
    try:
        importlib.metadata.distribution("kernels")
        pytest.skip("Hugging Face's kernels package is really installed here")
    except importlib.metadata.PackageNotFoundError:
        pass
    where = REPO if cwd == "repo" else tmp_path
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    result = __import__("json").loads(out.stdout.strip().splitlines()[-1])
    assert result["hub"] is False
    assert result["ours"] == "kvbench.kernels"
    if cwd == "outside":
        assert result["spec"] is False  # installed as kvbench.kernels, not as a top-level `kernels`
