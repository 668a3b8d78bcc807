"""A helper's pass over a committed record (maintenance's recovery, the next message of the
partition, a purge) signals only the copies a receiver would not drop now: passes that fail
part-way still bring the record closer to its end. Were every copy sent again on every pass,
a fan-out one of whose sends fails on each pass would never finish."""

from __future__ import annotations

from collections.abc import Callable

from bus import Command, Context, Endpoint, Settings
from bus.adapters.memory.faults import Fault
from bus.hosting.maintenance import maintenance_pass
from bus.hosting.worker import Worker
from bus.protocol.tokens.shards import endpoint_of
from bus.seams import Seams
from bus.testing import InMemoryStorage
from bus.testing.seamed import seamed_bus

PAD = "x" * 40_000  # two copies fill more than a queue message: each travels alone


class Fan(Command):
    ref: str


class Note(Command):
    ref: str
    n: int
    pad: str = ""


class EverySecondSendFails:
    """No faults, but while ``armed``: every second queue send fails before it takes effect."""

    def __init__(self) -> None:
        self.t = 1_900_000_000.0
        self.armed = False
        self.sends = 0

    def now(self) -> float:
        return self.t

    def before_call(self, service: str, operation: str) -> Fault | None:
        if not (self.armed and (service, operation) == ("queue", "send")):
            return None
        self.sends += 1
        return Fault.FAIL_BEFORE if self.sends % 2 == 0 else None

    def defer(self, effect: Callable[[], None]) -> None:  # pragma: no cover - no ghosts
        effect()


def test_a_fan_out_whose_passes_each_fail_part_way_still_finishes() -> None:
    hooks = EverySecondSendFails()
    desk, bell = Endpoint("desk"), Endpoint("bell")
    noted: list[int] = []

    @desk.handles(Fan, partition=lambda m: m.ref)
    def fan(message: Fan, ctx: Context) -> None:
        for n in range(2):
            ctx.send(Note(ref=message.ref, n=n, pad=PAD))

    @bell.handles(Note, partition=lambda m: f"{m.ref}.{m.n}")
    def note(message: Note, ctx: Context) -> None:
        noted.append(message.n)

    bus = seamed_bus(Seams(clock=hooks.now), InMemoryStorage(hooks=hooks), [desk, bell],
                     settings=Settings(depth_check_seconds=0))
    bus.provision()
    bus.send(Fan(ref="f1"))
    hooks.armed = True  # from here on, each pass's second send fails
    Worker(bus, "desk", retry_delay=0).poll_once()  # committed; Note 0 sent, Note 1 not
    bell = Worker(bus, "bell", retry_delay=0)
    for _ in range(3):  # the bell handles what came; maintenance takes the record up again
        bell.poll_once()
        hooks.t += 600
        maintenance_pass(bus, stalled_seconds=300.0)
    bell.poll_once()
    assert sorted(noted) == [0, 1]
    storage = bus.storage
    assert isinstance(storage, InMemoryStorage)
    tokens = [endpoint_of(row.partition_key)
              for row in storage.tables.rows(bus.names.tokens_table)]
    assert "desk" not in tokens  # the Fan's token consumed: its record finished
