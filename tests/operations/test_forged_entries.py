"""A replay sends only the copy the bus recorded (S10 of docs/security.md): an entry written
into the poison queue with a real message's ids and another body revives nothing - in an
unsigned deployment too, where nothing else tells the two apart - and the real entry still
replays the real message. Before, the forged entry replayed the forged body, and keeping one
entry per token kept the older one - the forged - and deleted the real one. On the in-memory
backend and Azurite."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta

import pytest

from bus import Bus
from bus.envelope import Envelope, encode_signal
from bus.protocol.poison.poisoned import ReplayResult
from bus.protocol.poison.queue import PoisonEntry
from bus.protocol.tokens.inbox import TokenState
from bus.protocol.tokens.shards import partition
from bus.storage import NotFound, Storage
from bus.testing import drain
from tests.support import dlq_app
from tests.support.dlq_app import Charge


@pytest.fixture(autouse=True)
def _failing() -> Iterator[None]:
    dlq_app.FAILING["on"] = True
    yield
    dlq_app.FAILING["on"] = True


def charged(bus: Bus, order_id: str) -> dict[str, object] | None:
    try:
        row = bus.storage.tables.get(bus.names.state_table("payments"), order_id, "charge")
    except NotFound:
        return None
    return dict(row.properties)


def forge(bus: Bus, real: PoisonEntry, **changes: object) -> None:
    """An entry as someone who may add queue messages writes it: the real message's envelope
    with ``changes``, dated before the real entry so that a replay of all meets it first."""
    assert real.envelope is not None
    envelope: Envelope = real.envelope.model_copy(update=changes)
    forged = PoisonEntry(reason="handler failed", dequeue_count=1, endpoint="payments",
                         original_body=encode_signal(envelope), envelope=envelope,
                         poisoned_at=real.poisoned_at - timedelta(seconds=1))
    bus.storage.queues.send(bus.names.poison_queue("payments"), forged.encode())


def test_a_forged_entry_with_the_real_ids_revives_nothing(storage: Storage,
                                                           prefix: str) -> None:
    bus = dlq_app.build(storage, prefix)
    bus.send(Charge(order_id="o1", amount=7))
    assert drain(bus, fail_fast=False).total() == {"poisoned": 1}
    [real] = bus.poisoned("payments").entries()
    forge(bus, real.entry, payload=json.dumps({"order_id": "o1", "amount": 7_000}))
    dlq_app.FAILING["on"] = False
    first, second = bus.poisoned("payments").entries()
    assert first.entry.poisoned_at < second.entry.poisoned_at and second.id == real.id
    assert bus.poisoned("payments").replay() == {first.id: ReplayResult.MISMATCHED,
                                                 real.id: ReplayResult.REPLAYED}
    assert drain(bus).total() == {"processed": 1}
    row = charged(bus, "o1")
    assert row is not None and row["amount"] == 7 and row["times"] == 1  # the real payload
    [left] = bus.poisoned("payments").entries()  # kept, to be looked at and purged
    assert left.id == first.id and left.token is None


def test_a_forged_entry_of_another_lineage_revives_nothing(storage: Storage,
                                                           prefix: str) -> None:
    """A token poisoned by an earlier version records no copy; its sender's lineage (type,
    source, correlation, cause) still tells a forged entry apart."""
    bus = dlq_app.build(storage, prefix)
    bus.send(Charge(order_id="o2", amount=7))
    assert drain(bus, fail_fast=False).total() == {"poisoned": 1}
    [real] = bus.poisoned("payments").entries()
    assert real.entry.envelope is not None
    table, attempt = bus.names.tokens_table, real.entry.envelope.attempt_id
    row = bus.storage.tables.get(table, partition("payments", attempt), attempt)
    assert "poisoned_by" in row.properties and row.properties["state"] == TokenState.POISONED
    row.properties.pop("poisoned_by")  # as an earlier version poisoned it
    bus.storage.tables.replace(table, row)
    forge(bus, real.entry, correlation_id="someone-else",
          payload=json.dumps({"order_id": "o2", "amount": 7_000}))
    dlq_app.FAILING["on"] = False
    first, _ = bus.poisoned("payments").entries()
    assert bus.poisoned("payments").replay() == {first.id: ReplayResult.MISMATCHED,
                                                 real.id: ReplayResult.REPLAYED}
    assert drain(bus).total() == {"processed": 1}
