"""The HTTP kvbench speaks besides the load itself, in one place.

- `get`: one blocking GET (what /health, /metrics, /version and /v1/models need: small answers, asked between
  phases or from a sampler thread), returning (status, body) for any HTTP answer.
- `side_session`: the aiohttp session of requests sent beside the load (agreement samples, canaries): a
  session of its own, so they never take one of the load's connection slots (the load's session, in
  `backend.OpenAIBackend`, is sized to the requests it keeps in flight), with the run's no-progress timeout.
"""

from __future__ import annotations

import urllib.error
import urllib.request

import aiohttp


def get(url: str, headers: dict[str, str] | None = None, timeout_s: float = 5.0) -> tuple[int, bytes]:
    """(HTTP status, body) of a GET; connection failures raise (urllib.error.URLError / OSError)."""
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read() if exc.fp else b""


def side_session(headers: dict[str, str] | None, stall_timeout_s: float) -> aiohttp.ClientSession:
    """A session for requests beside the load: any one that gets no byte for `stall_timeout_s` fails."""
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=stall_timeout_s, sock_read=stall_timeout_s)
    return aiohttp.ClientSession(timeout=timeout, headers=headers)
