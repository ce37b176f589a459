"""The HTTP kvbench speaks besides the load itself, in one place.

- `get`: one blocking GET (what /health, /metrics, /version and /v1/models need: small answers, asked between
  phases or from a sampler thread), returning (status, body) for any HTTP answer.
- `side_session`: the aiohttp session of requests sent beside the load (agreement samples, canaries): a
  session of its own, so they never take one of the load's connection slots (the load's session, in
  `backend.OpenAIBackend`, is sized to the requests it keeps in flight), with the run's no-progress timeout.

No redirect is followed, here or by the load (`allow_redirects=False` on every aiohttp request): a redirect
would re-send the API key and every --header to whatever host it names. `get` raises `RedirectRefused`
naming the target (credentials and secret query values redacted); an aiohttp request records it as an
HTTP failure whose text names the target.
"""

from __future__ import annotations

import urllib.error
import urllib.request

import aiohttp
import yarl

from kvbench.core.scrub import excerpt, redact_url

MAX_BODY_BYTES = 64 << 20  # a /metrics or /v1/models answer is kilobytes; a server that never stops is cut here


class RedirectRefused(urllib.error.URLError):
    """The server answered with a redirect, which kvbench does not follow."""

    def __init__(self, code: int, url: str, target: str):
        self.code, self.url, self.target = code, redact_url(url), redact_url(target)
        super().__init__(
            f"{self.url} redirects to {self.target} (HTTP {code}); kvbench does not follow redirects, "
            "which would send your key and headers there: give the final URL"
        )


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        raise RedirectRefused(code, req.full_url, newurl)


_OPENER = urllib.request.build_opener(_NoRedirect)


def get(url: str, headers: dict[str, str] | None = None, timeout_s: float = 5.0) -> tuple[int, bytes]:
    """(HTTP status, body) of a GET; connection failures raise (urllib.error.URLError / OSError), a redirect
    raises RedirectRefused."""
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with _OPENER.open(req, timeout=timeout_s) as resp:
            return resp.status, resp.read(MAX_BODY_BYTES)
    except RedirectRefused:
        raise
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(MAX_BODY_BYTES) if exc.fp else b""


async def error_text(resp: aiohttp.ClientResponse) -> str:
    """What a request's record keeps of a non-200 answer: the status and a short scrubbed excerpt of the body
    (a server may echo the request's headers into it), or the redirect's target."""
    if 300 <= resp.status < 400 and resp.headers.get("Location"):
        target = str(resp.url.join(yarl.URL(resp.headers["Location"])))
        return excerpt(f"HTTP {resp.status}: redirect to {redact_url(target)} not followed (it would carry the key)")
    body = await resp.content.read(4096)
    return excerpt(f"HTTP {resp.status}: {body.decode('utf-8', 'replace').strip()}")


async def raise_for_status(resp: aiohttp.ClientResponse) -> None:
    """aiohttp's raise_for_status for anything but 200, with `error_text` as its message (a redirect too)."""
    if resp.status != 200:
        raise aiohttp.ClientResponseError(
            resp.request_info, resp.history, status=resp.status, message=await error_text(resp)
        )


def side_session(headers: dict[str, str] | None, stall_timeout_s: float) -> aiohttp.ClientSession:
    """A session for requests beside the load: any one that gets no byte for `stall_timeout_s` fails. Its
    callers pass allow_redirects=False (see the module docstring)."""
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=stall_timeout_s, sock_read=stall_timeout_s)
    return aiohttp.ClientSession(timeout=timeout, headers=headers)
