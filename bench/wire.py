"""HTTP requests to storage counted on the wire, as a cross-check of the port counts.

The counting wrapper (``bus.testing.counting``) counts port calls, which is what the protocol
asks for. An adapter may need more than one request for one call: the SDK's
``receive_messages(max_messages=n)`` keeps fetching pages until it has ``n`` messages or a
page comes back empty. Azure bills requests, so the benchmark also counts every request the
Azure SDK sends (all three SDKs use azure-core's RequestsTransport), attributed to the
thread that sent it: ``consumer-*`` threads are the endpoints, ``producer-*`` the client.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

from azure.core.pipeline.transport import RequestsTransport

WireKey = tuple[str, str, str]  # (side, service, request)


def service_ports(connection_string: str) -> dict[int, str]:
    """Port -> service ("blob", "queue", "table") of an Azurite connection string."""
    ports: dict[int, str] = {}
    for service in ("blob", "queue", "table"):
        match = re.search(rf"{service.capitalize()}Endpoint=https?://[^:/;]+:(\d+)",
                          connection_string)
        if match:
            ports[int(match.group(1))] = service
    return ports


def classify(service: str, method: str, url: str) -> str:
    """A request's operation name, from its method and URL (the REST API's shapes)."""
    parts = urlsplit(url)
    path = parts.path.rstrip("/")
    query = parse_qs(parts.query)
    last = path.rsplit("/", 1)[-1]
    if service == "queue":
        if last == "messages" or "/messages/" in path + "/":
            kinds = {"POST": "send", "GET": "receive", "DELETE": "delete", "PUT": "update"}
            if method == "GET" and query.get("peekonly") == ["true"]:
                return "peek"
            return kinds.get(method, method.lower())
        if "comp" in query:
            return "properties" if method == "GET" else "metadata"
        return {"PUT": "create_queue", "DELETE": "delete_queue", "GET": "list_queues"}.get(
            method, method.lower())
    if service == "table":
        if last == "$batch":
            return "transact"
        if last.startswith("Tables"):
            return "create_table" if method == "POST" else "tables"
        if "(" in last and not last.endswith("()"):
            return {"GET": "get", "PUT": "replace", "MERGE": "merge", "PATCH": "merge",
                    "DELETE": "delete"}.get(method, method.lower())
        return "insert" if method == "POST" else "query"
    if query.get("restype") == ["container"]:
        if query.get("comp") == ["list"]:
            return "list"
        return "create_container" if method == "PUT" else "container"
    return {"GET": "read", "HEAD": "properties", "PUT": "write", "DELETE": "delete"}.get(
        method, method.lower())


class WireCounter:
    def __init__(self, ports: dict[int, str]) -> None:
        self._ports = ports
        self._lock = threading.Lock()
        self._counts: dict[WireKey, int] = {}

    def record(self, method: str, url: str, body: bytes | None) -> None:
        """Count one request; ``body`` is its response's (None when it failed)."""
        port = urlsplit(url).port
        service = self._ports.get(port or 0)
        if service is None:
            return
        name = threading.current_thread().name
        # A receiver's round runs its independent requests on the bus's lanes (threads named
        # bus-round-*): the endpoints' side.
        side = "consumer" if name.startswith("bus-round") else name.split("-", 1)[0]
        operation = classify(service, method, url)
        if operation == "receive" and body is not None and b"<QueueMessage>" not in body:
            operation = "receive_empty"  # as the port counter names an idle poll
        key = (side, service, operation)
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + 1

    def reset(self) -> None:
        with self._lock:
            self._counts.clear()

    def totals(self) -> dict[tuple[str, str], int]:
        """Requests sent by every thread, by (service, request)."""
        totals: dict[tuple[str, str], int] = {}
        with self._lock:
            for (_, service, op), n in self._counts.items():
                totals[(service, op)] = totals.get((service, op), 0) + n
        return dict(sorted(totals.items()))

    def side(self, side: str) -> dict[tuple[str, str], int]:
        """Requests sent by the threads of one side, by (service, request)."""
        with self._lock:
            return {(s, op): n for (who, s, op), n in sorted(self._counts.items())
                    if who == side}


_active: list[WireCounter] = []
_patch_lock = threading.Lock()


@contextlib.contextmanager
def counting_requests(connection_string: str) -> Iterator[WireCounter]:
    """Count the requests this process sends to the Azurite of ``connection_string``."""
    counter = WireCounter(service_ports(connection_string))
    with _patch_lock:
        if not _active:
            _install()
        _active.append(counter)
    try:
        yield counter
    finally:
        with _patch_lock:
            _active.remove(counter)


def _install() -> None:
    """Wrap RequestsTransport.send once for the whole process; a no-op when nobody counts."""
    original = RequestsTransport.send
    if getattr(original, "_bench_wire", False):
        return

    def send(transport: Any, request: Any, **kwargs: Any) -> Any:
        body: bytes | None = None
        # Only a queue receive's body is looked at (never a streamed blob download's).
        peek = request.method == "GET" and urlsplit(str(request.url)).path.endswith("/messages")
        try:
            response = original(transport, request, **kwargs)
            if peek:
                with contextlib.suppress(Exception):
                    body = response.body()
            return response
        finally:
            for counter in list(_active):
                counter.record(str(request.method), str(request.url), body)

    send._bench_wire = True  # type: ignore[attr-defined]
    RequestsTransport.send = send
