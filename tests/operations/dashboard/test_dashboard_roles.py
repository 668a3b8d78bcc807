"""The dashboard runs with the operators' roles of the Bicep (``operatorPrincipalId``), not the
app's account-wide ones (docs/dashboard.md, "Running it"): every route of its API, reads
and actions, is called against a store that records which queue, table and container each
storage call names, and each call must be one a role the Bicep grants the operators on that
resource allows. A route added to the API without a call here fails the test."""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from bus import Bus, Command, Context, Endpoint, RetryPolicy, Settings
from bus.adapters.memory import InMemoryStorage
from bus.testing import drain
from tests.operations.infra.test_roles import (
    BLOB_DATA_CONTRIBUTOR,
    ENDPOINT_QUEUES,
    POISON_QUEUES,
    QUEUE_DATA_CONTRIBUTOR,
    QUEUE_DATA_READER,
    QUEUE_MESSAGE_SENDER,
    STATE_TABLES,
    TABLE_DATA_CONTRIBUTOR,
    TABLE_DATA_READER,
    of,
)

fastapi = pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from bus.operations.dashboard import create_app  # noqa: E402

QUEUE_ROLES = {  # which roles allow a call of the queue port
    "send": {QUEUE_MESSAGE_SENDER, QUEUE_DATA_CONTRIBUTOR},
    "depth": {QUEUE_DATA_READER, QUEUE_DATA_CONTRIBUTOR},
    "oldest": {QUEUE_DATA_READER, QUEUE_DATA_CONTRIBUTOR},
    "peek": {QUEUE_DATA_READER, QUEUE_DATA_CONTRIBUTOR},
}
"""Any other queue call (receive, extend, delete) needs Storage Queue Data Contributor."""
TABLE_READS = {"get", "get_many", "query"}
"""Table calls Storage Table Data Reader allows; any other needs the Contributor."""

FAILING = {"on": True}


class Charge(Command):
    order: str
    n: int


def build() -> tuple[Bus, InMemoryStorage]:
    payments = Endpoint("payments", retry=RetryPolicy(delays=(0.0,)))

    @payments.handles(Charge, partition=lambda m: m.order, session=lambda m: m.order)
    def charge(message: Charge, ctx: Context) -> None:
        if FAILING["on"] and message.n == 1:
            raise RuntimeError("gateway down")
        ctx.state.put("charge", {"n": message.n})

    storage = InMemoryStorage()
    bus = Bus(storage, [payments], prefix="p", settings=Settings(max_delivery_count=2))
    bus.provision()
    return bus, storage


class Recorded:
    """Each storage call made while ``on``: (service, the resource it names, the call)."""

    def __init__(self, storage: InMemoryStorage) -> None:
        self.calls: set[tuple[str, str, str]] = set()
        self.on = False
        for service, port in (("queue", storage.queues), ("table", storage.tables),
                              ("blob", storage.blobs)):
            for name in dir(port):
                method = getattr(port, name)
                if not name.startswith("_") and callable(method):
                    setattr(port, name, self._wrapped(service, name, method))

    def _wrapped(self, service: str, name: str,
                 method: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if self.on and args:
                self.calls.add((service, str(args[0]), name))
            return method(*args, **kwargs)
        return call


def label(bus: Bus, service: str, resource: str) -> str:
    """The Bicep's name for the resource a call names (as test_roles labels scopes)."""
    names = bus.names
    known = {("queue", names.queue("payments")): ENDPOINT_QUEUES,
             ("queue", names.poison_queue("payments")): POISON_QUEUES,
             ("table", names.tokens_table): "table:tokensTableName",
             ("table", names.audit_table): "table:auditTableName",
             ("table", names.instances_table): "table:instancesTableName",
             ("table", names.state_table("payments")): STATE_TABLES,
             ("blob", names.payload_container): "container:payloadContainerName"}
    return known.get((service, resource), f"{service}:{resource} (no role of the operators')")


def allowed(service: str, call: str) -> set[str]:
    if service == "queue":
        return QUEUE_ROLES.get(call, {QUEUE_DATA_CONTRIBUTOR})
    if service == "table":
        return ({TABLE_DATA_READER, TABLE_DATA_CONTRIBUTOR} if call in TABLE_READS
                else {TABLE_DATA_CONTRIBUTOR})
    return {BLOB_DATA_CONTRIBUTOR}


@pytest.fixture
def dashboard() -> Iterator[tuple[Bus, TestClient, Recorded]]:
    FAILING["on"] = True
    bus, storage = build()
    for n in (1, 2, 3):  # 1 fails (poisoned), 2 and 3 wait in the session behind it
        bus.send(Charge(order="o", n=n))
    bus.send(Charge(order="p", n=1))
    drain(bus, fail_fast=False)
    recorded = Recorded(storage)
    client = TestClient(create_app(bus, allow_actions=True),
                        headers={"origin": "http://testserver"})
    yield bus, client, recorded
    FAILING["on"] = True


def test_every_route_needs_only_the_operators_roles(
        dashboard: tuple[Bus, TestClient, Recorded]) -> None:
    bus, client, recorded = dashboard
    recorded.on = True
    entries = [entry for group in client.get("/api/poisoned").json()["groups"]
               for entry in group["entries"]]
    first, second = entries
    deferred = client.get("/api/deferred").json()
    calls = {
        "GET /api/endpoints": lambda: client.get("/api/endpoints?period=3600"),
        "POST /api/endpoints/{endpoint}/pause": lambda: client.post(
            "/api/endpoints/payments/pause", json={"seconds": 5, "reason": "deploying"}),
        "POST /api/endpoints/{endpoint}/resume": lambda: client.post(
            "/api/endpoints/payments/resume"),
        "GET /api/poisoned": lambda: client.get("/api/poisoned"),
        "GET /api/poisoned/{endpoint}/{entry_id}": lambda: client.get(
            f"/api/poisoned/payments/{first['id']}"),
        "POST /api/poisoned/{endpoint}/replay": lambda: client.post(
            "/api/poisoned/payments/replay", json={"ids": [first["id"]], "count": 1}),
        "POST /api/poisoned/{endpoint}/purge": lambda: client.post(
            "/api/poisoned/payments/purge", json={"ids": [second["id"]], "count": 1}),
        "GET /api/deferred": lambda: client.get("/api/deferred"),
        "POST /api/deferred/{endpoint}/{message_id}/release": lambda: client.post(
            f"/api/deferred/payments/{deferred[0]['message_id']}/release"),
        "GET /api/sessions": lambda: client.get("/api/sessions"),
        "POST /api/sessions/{endpoint}/{session}/skip": lambda: client.post(
            "/api/sessions/payments/o/skip"),
        "POST /api/sessions/{endpoint}/{session}/close": lambda: client.post(
            "/api/sessions/payments/o/close"),
        "GET /api/scheduled": lambda: client.get("/api/scheduled"),
        "GET /api/conversation": lambda: client.get(
            f"/api/conversation?id={first['message_id']}"),
        "GET /api/settings": lambda: client.get("/api/settings"),
        "GET /api/instances": lambda: client.get("/api/instances"),
        "GET /api/audit": lambda: client.get("/api/audit?limit=20"),
    }
    routes = {f"{method.upper()} {path}"
              for path, methods in client.app.openapi()["paths"].items()  # type: ignore[attr-defined]
              for method in methods}
    assert routes == set(calls), "a route of the API is not called here: add it to calls"
    for route, call in calls.items():
        assert call().status_code == 200, route
    grants = of("operatorPrincipalId")
    refused = collections.defaultdict(set)
    for service, resource, name in recorded.calls:
        scope = label(bus, service, resource)
        if not any((role, scope) in grants for role in allowed(service, name)):
            refused[scope].add(name)
    assert dict(refused) == {}
    touched = {label(bus, service, resource) for service, resource, _ in recorded.calls}
    assert {ENDPOINT_QUEUES, POISON_QUEUES, "table:tokensTableName", STATE_TABLES,
            "table:auditTableName", "table:instancesTableName"} <= touched
