"""The bus workload: messages, endpoints and the exactly-once check of their effects.

Every handler does the smallest realistic unit of work: read a counter row of its state
partition and write it back incremented. So each message's effect is visible, and at the end
the counters must equal the number of messages sent to each partition: a lost message leaves
a counter short, a doubled effect leaves it high, and the scenario fails instead of reporting.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import ClassVar

from bench.harness import BenchError
from bus import Command, Context, Endpoint, Event
from bus.storage import Tables

HOP_FROM = "bench-a"
HOP_TO = "bench-b"
SUBSCRIBERS = ("bench-s1", "bench-s2", "bench-s3")
COUNT_ROW = "count"


class Ping(Command):
    message_type: ClassVar[str] = "bench.Ping"
    seq: int
    key: str
    sent_at: float
    """time.time() when the client started sending it (for the latency scenario)."""


class Pong(Command):
    message_type: ClassVar[str] = "bench.Pong"
    seq: int
    key: str


class Pinged(Event):
    message_type: ClassVar[str] = "bench.Pinged"
    seq: int
    key: str
    sent_at: float


Observer = Callable[[Ping], None]
"""Called by the Ping handler with its message (the latency scenario's probe)."""


def partition_key(seq: int, partitions: int) -> str:
    """Round-robin: consecutive messages - the ones in flight together - land in different
    partitions, so concurrent workers never race for one partition's outbox slot unless
    ``partitions`` is smaller than the number of messages in flight."""
    return f"p{seq % partitions}"


def counter_row(message: object) -> tuple[str]:
    """The rows a counting handler reads (``handles(reads=)``: fetched with the claim)."""
    return (COUNT_ROW,)


def count_effect(ctx: Context) -> None:
    row = ctx.state.get(COUNT_ROW)
    seen = row["n"] if row else 0
    assert isinstance(seen, int)
    ctx.state.put(COUNT_ROW, {"n": seen + 1})


def hop_endpoints(observe: Observer | None = None) -> list[Endpoint]:
    """``bench-a`` handles Ping: one state update and one Pong to ``bench-b``.

    ``bench-b`` is declared so that its queue exists and Pong has a route; the benchmark
    never runs it (its queue only collects the Pongs, counted at the end).
    """
    a, b = Endpoint(HOP_FROM), Endpoint(HOP_TO)

    @a.handles(Ping, partition=lambda m: m.key, reads=counter_row)
    def ping(message: Ping, ctx: Context) -> None:
        if observe is not None:
            observe(message)
        count_effect(ctx)
        ctx.send(Pong(seq=message.seq, key=message.key))

    @b.handles(Pong, partition=lambda m: m.key, reads=counter_row)
    def pong(message: Pong, ctx: Context) -> None:
        count_effect(ctx)

    return [a, b]


def fanout_endpoints() -> list[Endpoint]:
    """Three endpoints subscribed to Pinged, each counting it in its own state table."""
    endpoints = [Endpoint(name) for name in SUBSCRIBERS]
    for endpoint in endpoints:
        endpoint.handles(Pinged, partition=lambda m: m.key, reads=counter_row)(
            lambda message, ctx: count_effect(ctx))
    return endpoints


def expected_counts(seqs: Iterable[int], partitions: int) -> Counter[str]:
    return Counter(partition_key(seq, partitions) for seq in seqs)


def verify_counts(tables: Tables, table: str, expected: Mapping[str, int]) -> None:
    """Raise BenchError unless every partition's counter equals its expected count."""
    found = {row.partition_key: row.properties.get("n")
             for row in tables.query(table) if row.row_key == COUNT_ROW}
    wrong = {key: (found.get(key), n) for key, n in expected.items() if found.get(key) != n}
    extra = sorted(set(found) - set(expected))
    if wrong or extra:
        sample = dict(list(wrong.items())[:5])
        raise BenchError(
            f"{table}: {len(wrong)} partitions with a wrong count (found, expected), e.g. "
            f"{sample}; {len(extra)} unexpected partitions: not exactly once")
