"""The HTTP session under the SDK clients: ``requests``, without the per-request merging the
SDK never needs.

azure-core's ``RequestsTransport`` hands every request to ``Session.request``, which merges the
request with the session's cookies, auth, params and hooks, looks for redirects to follow,
extracts cookies from the response and, for each merge, walks the settings through generic
``Mapping`` checks. Storage requests carry none of these: they are signed by a header, never
follow redirects (the transport passes ``allow_redirects=False``) and never set cookies. That
bookkeeping was about a third of the Python CPU of each storage request (measured on this
machine: see docs/performance.md), and the exactly-once hop makes several requests.

:class:`LeanSession` prepares the request with the same ``PreparedRequest`` steps that matter
(method, URL quoting, header validation, body and Content-Length) and sends it through the
same mounted ``HTTPAdapter`` (urllib3 pool, timeouts, TLS verification), so the bytes on the
wire are those ``requests`` would send. Anything outside that path - proxies, cookies, auth,
files, hooks, redirects to follow - goes through ``requests.Session.request`` unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import requests
from requests.structures import CaseInsensitiveDict

_LEAN_DEFAULTS: dict[str, Any] = {
    "params": None, "cookies": None, "files": None, "auth": None, "hooks": None,
    "json": None,
}


def _merged(session: Mapping[str, Any], request: Mapping[str, Any] | None) -> dict[str, Any]:
    """The session's default headers overridden by the request's, as ``Session.request``
    merges them (a header set to None is left out); the order is the session's first."""
    merged = CaseInsensitiveDict(session)
    merged.update(request or {})
    return {name: value for name, value in merged.items() if value is not None}


class LeanSession(requests.Session):
    """A ``requests.Session`` whose ``request`` skips session merging when there is nothing
    to merge. Build it with ``trust_env = False`` (the adapter reads the environment's proxies
    once, when the clients are built)."""

    def request(self, method: str, url: str,  # type: ignore[override]
                *args: Any, **kwargs: Any) -> requests.Response:
        if args or not self._lean(kwargs):
            return super().request(method, url, *args, **kwargs)
        prepared = requests.PreparedRequest()
        prepared.prepare_method(method)
        prepared.prepare_url(url, None)
        prepared.prepare_headers(_merged(self.headers, kwargs.get("headers")))
        prepared.prepare_body(kwargs.get("data"), None)
        stream = bool(kwargs.get("stream"))
        response = self.get_adapter(url=str(prepared.url)).send(
            prepared, stream=stream, timeout=kwargs.get("timeout"),
            verify=kwargs.get("verify", True), cert=kwargs.get("cert"), proxies={})
        if not stream:
            _ = response.content  # read the body now, as Session.send does
        return response

    def _lean(self, kwargs: Mapping[str, Any]) -> bool:
        """Whether this call needs none of what ``Session.request`` merges or follows."""
        if self.trust_env or self.proxies or self.cookies or self.auth or self.params:
            return False
        if kwargs.get("allow_redirects", True) or kwargs.get("proxies"):
            return False
        known = {"headers", "data", "stream", "timeout", "verify", "cert", "allow_redirects",
                 "proxies", *_LEAN_DEFAULTS}
        if any(key not in known for key in kwargs):
            return False
        return all(kwargs.get(key) in (None, {}, []) for key in _LEAN_DEFAULTS)
