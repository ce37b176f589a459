"""lm-eval's requests under kvbench's redirect rule (harness/client/http.py): no redirect is followed.

lm-eval's `local-completions` model posts every request with the user's key and --header values, through
`requests.post` (one request in flight) or an aiohttp session (several), and both follow redirects, so a
server (or whatever answers in its place) could send the credential to another host, or from https to
plain http. `completions_model` returns lm-eval's model with both paths going through sessions that do not
follow a redirect: the answer is refused with `http.RedirectRefused`, naming the target (redacted).
"""

from __future__ import annotations

import copy

from kvbench.harness.client.http import RedirectRefused


def _refuse(status: int, url: str, location: str | None) -> None:
    if 300 <= status < 400:
        raise RedirectRefused(status, url, location or "(no Location)")


class _Checked:
    """`async with session.post(...)` whose response is refused, and released, when it is a redirect."""

    def __init__(self, ctx, url: str):
        self._ctx, self._url = ctx, url

    async def __aenter__(self):
        resp = await self._ctx.__aenter__()
        try:
            _refuse(resp.status, self._url, resp.headers.get("Location"))
        except RedirectRefused:
            await self._ctx.__aexit__(None, None, None)
            raise
        return resp

    async def __aexit__(self, *exc):
        return await self._ctx.__aexit__(*exc)


class NoRedirectSession:
    """lm-eval's aiohttp session, posting without following redirects (the only call lm-eval makes on it)."""

    def __init__(self, session):
        self._session = session

    def post(self, url, **kwargs):
        kwargs["allow_redirects"] = False
        return _Checked(self._session.post(url, **kwargs), str(url))


def completions_model(**kwargs):
    """lm-eval's LocalCompletionsAPI(**kwargs), sending every request without following redirects."""
    import requests
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    class NoRedirectCompletions(LocalCompletionsAPI):
        def model_call(self, messages, *, generate=True, gen_kwargs=None, **kw):
            # lm-eval's own model_call, through a session that does not follow redirects
            payload = self._create_payload(
                self.create_message(messages),
                generate=generate,
                gen_kwargs=copy.deepcopy(gen_kwargs),
                seed=self._seed,
                eos=self.eos_string,
                **kw,
            )
            resp = self._http().post(
                self.base_url,
                json=payload,
                headers=self.header,
                verify=self.verify_certificate,
                timeout=self.timeout,
                allow_redirects=False,
            )
            _refuse(resp.status_code, self.base_url, resp.headers.get("Location"))
            resp.raise_for_status()
            return resp.json()

        def _http(self):
            if getattr(self, "_kvbench_http", None) is None:
                self._kvbench_http = requests.Session()
                self._kvbench_http.max_redirects = 0
            return self._kvbench_http

        async def amodel_call(self, session, sem, messages, **kw):
            return await super().amodel_call(NoRedirectSession(session), sem, messages, **kw)

    return NoRedirectCompletions(**kwargs)
