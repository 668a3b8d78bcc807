"""The dashboard's reads change nothing (S14 of docs/security.md): a message the Functions host
moved to a poison queue itself is listed as it is - its token stays live, the message stays the
host's - where a read used to adopt it (an entry of the bus's own, its token poisoned). The
actions, maintenance and the Python API's reads adopt it as before."""

from __future__ import annotations

from fastapi.testclient import TestClient

from bus.operations.dashboard import create_app
from bus.protocol.poison.poisoned import HOST_REASON
from bus.protocol.tokens.inbox import TokenState
from bus.testing import InMemoryStorage
from tests.operations.dashboard import shop


def test_reading_the_poison_queue_leaves_the_hosts_message_as_it_is() -> None:
    bus = shop.build(InMemoryStorage(), "rd")
    bus.send(shop.Charge(order_id="o1", amount=5))
    queue, poison = bus.names.queue("payments"), bus.names.poison_queue("payments")
    [message] = bus.storage.queues.receive(queue, max_messages=1, lease=30)
    bus.storage.queues.send(poison, message.body)  # what the host does at maxDequeueCount
    bus.storage.queues.delete(queue, message)
    [(_, attempt_id)] = [(t.message_id, t.attempt_id) for t in bus.parts.inbox.all("payments")]
    client = TestClient(create_app(bus, allow_actions=False))
    listed = client.get("/api/poisoned").json()
    [group] = listed["groups"]
    [entry] = group["entries"]
    assert entry["reason"] == HOST_REASON and not entry["replayable"]
    assert client.get(f"/api/poisoned/payments/{entry['id']}").status_code == 200
    assert client.get("/api/conversation", params={"id": "o1"}).status_code == 200
    token = bus.parts.inbox.read("payments", attempt_id)
    assert token is not None and token.state is TokenState.LIVE
    assert bus.storage.queues.bodies(poison) == [message.body]  # still the host's
    # A reading through the Python API adopts it, as maintenance does: a crash (the host
    # moved it), so it is retried automatically after a while - no entry, its token live.
    assert bus.poisoned("payments").entries() == []
    token = bus.parts.inbox.read("payments", attempt_id)
    assert token is not None and token.state is TokenState.LIVE and token.recoveries == 1
