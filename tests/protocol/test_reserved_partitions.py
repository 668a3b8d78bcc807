"""The bus's own partitions of an endpoint's state table (``~bus.`` - statistics) are out of
reach of a partition key taken from a message: such a message is poisoned with the reason, so
maintenance's clean-up of old statistics can never delete a user's state, and the statistics
reader never meets a user's row."""

from __future__ import annotations

from bus import Bus, Command, Context, Endpoint
from bus.hosting.maintenance import maintenance_pass
from bus.observability import stats
from bus.settings import Settings
from bus.testing import InMemoryStorage, drain


class Note(Command):
    key: str  # from user data: a hostile one names a partition of the bus's own
    text: str


def build() -> Bus:
    desk = Endpoint("desk")

    @desk.handles(Note, partition=lambda m: m.key)
    def note(message: Note, ctx: Context) -> None:
        ctx.state.put("note", {"text": message.text})

    bus = Bus(InMemoryStorage(), [desk], settings=Settings(stats_retention_days=7))
    bus.provision()
    return bus


def test_a_partition_key_in_the_bus_namespace_is_poisoned_with_the_reason() -> None:
    bus = build()
    old_day = stats.day_partition(bus.parts.clock() - 8 * 86_400)  # maintenance clears it now
    assert old_day.startswith("~bus.")
    bus.send(Note(key=old_day, text="mine"))
    bus.send(Note(key="customer-7", text="kept"))
    assert drain(bus, fail_fast=False).total() == {"processed": 1, "poisoned": 1}
    [entry] = bus.poisoned("desk").entries()
    assert "reserved" in entry.entry.reason and old_day in entry.entry.reason
    assert bus.read_state("desk", old_day, "note") is None
    maintenance_pass(bus)
    assert bus.read_state("desk", "customer-7", "note") == {"text": "kept"}
