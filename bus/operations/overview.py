"""What an operator looks at per endpoint, beyond its queues: scheduled messages and the
per-minute statistics (``bus.observability.stats``) over a period."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from bus.bus import Bus
from bus.observability import stats
from bus.protocol.tokens.inbox import TokenState


@dataclass(frozen=True)
class ScheduledMessage:
    endpoint: str
    message_id: str
    attempt_id: str
    due_at: float
    """When its signal becomes visible (epoch seconds)."""
    message_type: str | None
    """From the token's lineage; None for a token written before tokens kept it."""


def scheduled(bus: Bus, endpoint: str, now: float | None = None) -> list[ScheduledMessage]:
    """The copies at ``endpoint`` still waiting for their time, soonest first (a scan of the
    endpoint's tokens: one request per 1,000 messages in flight)."""
    now = bus.parts.clock() if now is None else now
    waiting = [token for token in bus.parts.inbox.all(endpoint)
               if token.due is not None and token.due > now
               and token.state in (TokenState.LIVE, TokenState.PENDING)]
    return sorted((ScheduledMessage(endpoint, t.message_id, t.attempt_id, t.due or 0.0,
                                    t.lineage.message_type if t.lineage else None)
                   for t in waiting), key=lambda m: (m.due_at, m.message_id))


@dataclass(frozen=True)
class Percentiles:
    """The 50th, 95th and 99th percentiles (None: nothing counted), read from the buckets
    the hosts count in (``bus.observability.stats``)."""

    p50: float | None
    p95: float | None
    p99: float | None

    @classmethod
    def of(cls, quantile: Callable[[float], float | None]) -> Percentiles:
        return cls(quantile(0.5), quantile(0.95), quantile(0.99))


@dataclass(frozen=True)
class TypeStats:
    """One message type's signals at an endpoint over a period."""

    message_type: str
    processed: int
    failed: int
    poisoned: int
    processing_ms: Percentiles
    critical_seconds: Percentiles


@dataclass(frozen=True)
class EndpointStats:
    """One endpoint's signals over a period, from the hosts' per-minute rows."""

    endpoint: str
    processed: int
    failed: int
    """The handler raised or storage failed (each delivery counted: the signal comes back)."""
    poisoned: int
    other: int
    """Duplicates, deferrals, early scheduled copies put back, ..."""
    seconds: float
    """The period's length."""
    mean_ms: float | None
    """Mean processing time of a signal (decoding to outcome); None without signals."""
    max_ms: float | None
    per_minute: list[tuple[float, int]]
    """(minute start, epoch seconds; messages processed in it), minutes with signals only."""
    processing_ms: Percentiles = Percentiles(None, None, None)
    """Processing time of a signal (decoding to outcome), milliseconds."""
    critical_seconds: Percentiles = Percentiles(None, None, None)
    """Critical time of a processed message: from when it was due (sent, or its
    ``not_before``) to processed, seconds."""
    critical_per_minute: list[tuple[float, float]] = field(default_factory=list)
    """(minute start, its 95th percentile of critical time), minutes with processed messages."""
    depth: list[tuple[float, int]] = field(default_factory=list)
    """(minute start, the queue's length), as maintenance found it (each pass)."""
    drain_seconds: float | None = None
    """Estimated time to drain the queue: its last length over how fast it fell in the last
    ``DRAIN_WINDOW`` seconds of lengths - or, with one length only, over the processing rate
    then; 0 for an empty queue; None when it did not fall or nothing is known."""
    per_type: list[TypeStats] = field(default_factory=list)
    """Per message type, busiest first."""

    @property
    def throughput_per_minute(self) -> float:
        return self.processed / (self.seconds / 60) if self.seconds > 0 else 0.0


DRAIN_WINDOW = 900.0


def endpoint_stats(bus: Bus, endpoint: str, since: float, until: float) -> EndpointStats:
    """``endpoint``'s statistics for the minutes starting in [``since``, ``until``): one
    query per UTC day of the period."""
    minutes = stats.read(bus.storage.tables, bus.names.state_table(endpoint), since, until)
    total = sum((m.tally for m in minutes.values()), stats.Tally())
    signals = total.signals
    types: dict[str, stats.Tally] = {}
    for minute in minutes.values():
        for name, tally in minute.types.items():
            types[name] = types.get(name, stats.Tally()) + tally
    depth = [(start, m.depth) for start, m in minutes.items() if m.depth is not None]
    return EndpointStats(
        endpoint, total.processed, total.failed, total.poisoned, total.other, until - since,
        total.total_ms / signals if signals else None, total.max_ms if signals else None,
        [(start, m.tally.processed) for start, m in minutes.items() if m.tally.signals],
        Percentiles.of(total.processing_ms), Percentiles.of(total.critical_seconds),
        [(start, p95) for start, m in minutes.items()
         if (p95 := m.tally.critical_seconds(0.95)) is not None],
        depth, _drain(depth, minutes),
        [TypeStats(name, t.processed, t.failed, t.poisoned, Percentiles.of(t.processing_ms),
                   Percentiles.of(t.critical_seconds))
         for name, t in sorted(types.items(), key=lambda item: (-item[1].signals, item[0]))])


def _drain(depth: list[tuple[float, int]], minutes: dict[float, stats.Minute]) -> float | None:
    if not depth:
        return None
    last_at, last = depth[-1]
    if last == 0:
        return 0.0
    earlier = [(at, d) for at, d in depth if last_at - DRAIN_WINDOW <= at < last_at]
    if earlier:
        first_at, first = earlier[0]
        falling = (first - last) / (last_at - first_at)
        return last / falling if falling > 0 else None
    processed = sum(m.tally.processed for at, m in minutes.items()
                    if last_at - DRAIN_WINDOW <= at <= last_at)
    return last / (processed / DRAIN_WINDOW) if processed else None
