"""A token row the bus never wrote - an unknown state, a missing field; anyone who may insert
tokens (the producer role) can write one - is left out of every scan of the tokens table, so
the sweeper, the deferred and scheduled lists and the conversation view go on working."""

from __future__ import annotations

import pytest

from bus import Bus, Command, Context, Endpoint
from bus.operations.conversation import conversation
from bus.operations.overview import scheduled
from bus.storage import Entity, Storage
from bus.testing import drain


class Hold(Command):
    ref: str


@pytest.mark.parametrize(("partition", "properties"), [
    ("desk", {"state": "bogus", "message_id": "m1"}),
    ("desk", {"message_id": "m1"}),
    ("desk", {"state": "pending", "message_id": "m1", "origin_endpoint": "desk"}),
    # A live token in a shard's partition whose attempt id names no shard: the bus would look
    # for it elsewhere, so the sweeper could never poison it, only report it every pass.
    ("desk~3", {"state": "live", "message_id": "m1", "since": 0.0}),
], ids=["unknown state", "no state", "half an origin", "another shard"])
def test_a_token_row_the_bus_never_wrote_stops_no_scan(
        partition: str, properties: dict[str, object], storage: Storage, prefix: str) -> None:
    desk = Endpoint("desk")

    @desk.handles(Hold, partition=lambda m: m.ref)
    def hold(message: Hold, ctx: Context) -> None:
        ctx.defer()

    bus = Bus(storage, [desk], prefix=prefix)
    bus.provision()
    bus.send(Hold(ref="h1"))
    drain(bus)
    bus.storage.tables.insert(bus.names.tokens_table, Entity(partition, "forged", properties))
    tokens = bus.parts.inbox.all("desk")
    assert [t.attempt_id for t in tokens] != [] and "forged" not in {t.attempt_id
                                                                      for t in tokens}
    bus.sweeper().sweep()
    assert bus.poisoned("desk").entries() == []  # nothing reported of a row left out
    [deferred] = bus.deferred("desk").list()
    assert scheduled(bus, "desk") == []
    assert conversation(bus, deferred.envelope.correlation_id).messages
