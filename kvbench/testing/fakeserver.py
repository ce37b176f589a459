"""A fake OpenAI-compatible streaming server with known timing, for truth checks and the client roofline.

It streams `max_tokens` tokens (ignore_eos semantics) as SSE chunks shaped like vLLM's: the first chunk
`ttft_s` after the request arrived, then one chunk every `itl_s`, each holding `tokens_per_chunk` tokens,
with `usage` on every chunk (continuous usage stats) and a final usage-only chunk, then `[DONE]`.
Chunk times are deadlines from the arrival (not cumulative sleeps), so lateness does not accumulate,
and every write is logged with its `perf_counter()` time taken just before the write, so no byte can reach
a client before its stamp (CLOCK_MONOTONIC is shared by processes on one host: a client can compare).

Faults by arrival order (1-based): every `fail_every`-th request gets HTTP 500, every `hang_every`-th
never finishes (after `hang_after_chunks` chunks; 0 = before the response headers), every
`drop_every`-th has its connection closed after `drop_after_chunks` chunks.

With `ttft_s == itl_s == 0` (zero-compute) the whole response is written at once: the client roofline
measures the client, not this server.

Requests without `"stream": true` get one JSON response (see FakeConfig.answers: it can answer kvbench's
retrieval prompts, and corrupt them above a concurrency).

Endpoints: POST /v1/completions, /v1/chat/completions; GET /v1/models, /health, /metrics (Prometheus text
with vLLM names); control: GET/POST /fake/config (POST replaces fields and resets counters and log),
GET /fake/log (?clear=1), GET /fake/headers (every request's headers: where a credential went).

In-process: `with FakeServer(FakeConfig(ttft_s=0.05)) as srv: srv.base_url` (its own thread and event
loop) or `FakeServer(..., mode="process")` (a subprocess: no shared GIL with the client). Standalone:
`python -m kvbench.testing.fakeserver --port 8000 --ttft-ms 50 --itl-ms 10 --tokens-per-chunk 4`.

The parts: fakestate (FakeConfig, the server's state), fakestream (the completion endpoint and its streams),
fakeanswers (whole answers), fakeroutes (the other routes and the app); this module runs it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from dataclasses import asdict
from typing import Any

from aiohttp import web

from kvbench.testing.fakeanswers import passkey_answer
from kvbench.testing.fakeroutes import make_app
from kvbench.testing.fakestate import READY, STATE, FakeConfig

__all__ = ["FakeConfig", "FakeServer", "main", "make_app", "passkey_answer"]


async def _serve(app: web.Application, sock: socket.socket) -> web.AppRunner:
    # handler_cancellation: a client that gives up on a hung request frees its handler.
    runner = web.AppRunner(app, handle_signals=False, access_log=None, handler_cancellation=True, shutdown_timeout=0.5)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    return runner


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.setblocking(False)
    return sock


class FakeServer:
    """The fake server, in a background thread (mode="thread") or a subprocess (mode="process")."""

    def __init__(
        self,
        config: FakeConfig | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        mode: str = "thread",
        uvloop: bool = False,
    ):
        if mode not in ("thread", "process"):
            raise ValueError("mode must be 'thread' or 'process'")
        self.config = config or FakeConfig()
        self.host = host
        self.port = port
        self.mode = mode
        self.uvloop = uvloop  # process mode only
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._app: web.Application | None = None
        self._proc: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> FakeServer:
        if self.mode == "thread":
            self._start_thread()
        else:
            self._start_process()
        return self

    def _start_thread(self) -> None:
        sock = _bind(self.host, self.port)
        self.port = sock.getsockname()[1]
        ready = threading.Event()
        errors: list[BaseException] = []

        def main():
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            try:
                self._app = make_app(self.config)
                self._runner = loop.run_until_complete(_serve(self._app, sock))
            except BaseException as e:  # reported to the starting thread
                errors.append(e)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=main, name="kvbench-fakeserver", daemon=True)
        self._thread.start()
        ready.wait(30)
        if errors:
            raise errors[0]

    def _start_process(self) -> None:
        cmd = [
            sys.executable,
            "-m",
            "kvbench.testing.fakeserver",
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--config-json",
            json.dumps(asdict(self.config)),
        ]
        cmd += ["--uvloop", "auto" if self.uvloop else "no"]
        self._proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True
        )
        line = self._proc.stdout.readline()  # the child prints its URL once it listens
        if not line.startswith(READY):
            self.stop()
            raise RuntimeError(f"fake server did not start (got {line!r})")
        self.port = int(line.rsplit(":", 1)[1])

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            loop, app = self._loop, self._app

            def shutdown():
                if app is not None:
                    app[STATE].stopping.set()  # release hung handlers
                loop.call_later(0.05, loop.stop)

            loop.call_soon_threadsafe(shutdown)
            self._thread.join(10)
            self._thread = self._loop = None
        if self._proc is not None:
            if self._proc.poll() is None:
                try:
                    os.killpg(self._proc.pid, signal.SIGTERM)
                    self._proc.wait(5)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    try:
                        os.killpg(self._proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    self._proc.wait(5)
            if self._proc.stdout:
                self._proc.stdout.close()
            self._proc = None

    def __enter__(self) -> FakeServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- control over HTTP (the same for both modes) ---------------------------------------------

    def _call(self, path: str, data: dict | None = None) -> Any:
        req = urllib.request.Request(self.base_url + path, method="POST" if data is not None else "GET")
        body = None
        if data is not None:
            body = json.dumps(data).encode()
            req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, body, timeout=10) as resp:
            return json.loads(resp.read())

    def configure(self, **changes: Any) -> dict[str, Any]:
        """Change settings (and reset the arrival counter and log) on the running server."""
        return self._call("/fake/config", changes)

    def headers_seen(self) -> list[dict[str, str]]:
        """Every request's path and headers since the last configure()."""
        return self._call("/fake/headers")

    def log(self, clear: bool = False) -> list[dict[str, Any]]:
        """Per request: arrival index, received_s and writes_s (perf_counter), outcome."""
        return self._call("/fake/log" + ("?clear=1" if clear else ""))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m kvbench.testing.fakeserver", description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="0: any free port (printed on stdout)")
    ap.add_argument("--ttft-ms", type=float, default=0.0)
    ap.add_argument("--itl-ms", type=float, default=0.0, help="delay between chunks")
    ap.add_argument("--tokens-per-chunk", type=int, default=1)
    ap.add_argument("--model", default="kvbench-fake")
    ap.add_argument("--fail-every", type=int, default=0)
    ap.add_argument("--hang-every", type=int, default=0)
    ap.add_argument("--hang-after-chunks", type=int, default=0)
    ap.add_argument("--drop-every", type=int, default=0)
    ap.add_argument("--drop-after-chunks", type=int, default=1)
    ap.add_argument("--no-usage", action="store_true")
    ap.add_argument("--no-continuous-usage", action="store_true")
    ap.add_argument("--config-json", help="a full FakeConfig as JSON (overrides the flags)")
    # Off by default: libuv's loop clock has millisecond granularity and its timers can fire up to 1 ms
    # early, which would break the guarantee that no chunk leaves before its configured time.
    ap.add_argument(
        "--uvloop", choices=["auto", "yes", "no"], default="no", help="serve on uvloop (auto: if installed)"
    )
    a = ap.parse_args(argv)
    if a.config_json:
        cfg = FakeConfig(**json.loads(a.config_json))
    else:
        cfg = FakeConfig(
            ttft_s=a.ttft_ms / 1e3,
            itl_s=a.itl_ms / 1e3,
            tokens_per_chunk=a.tokens_per_chunk,
            model=a.model,
            fail_every=a.fail_every,
            hang_every=a.hang_every,
            hang_after_chunks=a.hang_after_chunks,
            drop_every=a.drop_every,
            drop_after_chunks=a.drop_after_chunks,
            usage=not a.no_usage,
            continuous_usage=not a.no_continuous_usage,
        )
    if a.uvloop != "no":
        try:
            import uvloop

            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        except ImportError:
            if a.uvloop == "yes":
                raise
    asyncio.run(_main(cfg, a.host, a.port))


async def _main(cfg: FakeConfig, host: str, port: int) -> None:
    sock = _bind(host, port)
    app = make_app(cfg)
    runner = await _serve(app, sock)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"{READY} http://{host}:{sock.getsockname()[1]}", flush=True)
    await stop.wait()
    app[STATE].stopping.set()
    await runner.cleanup()


if __name__ == "__main__":
    main()
