"""What an operator looks at per endpoint, beyond its queues: scheduled messages and the
per-minute statistics (``bus.observability.stats``) over a period."""

from __future__ import annotations

from dataclasses import dataclass

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

    @property
    def throughput_per_minute(self) -> float:
        return self.processed / (self.seconds / 60) if self.seconds > 0 else 0.0


def endpoint_stats(bus: Bus, endpoint: str, since: float, until: float) -> EndpointStats:
    """``endpoint``'s statistics for the minutes starting in [``since``, ``until``): one
    query per UTC day of the period."""
    minutes = stats.read(bus.storage.tables, bus.names.state_table(endpoint), since, until)
    total = sum(minutes.values(), stats.Tally())
    signals = total.signals
    return EndpointStats(
        endpoint, total.processed, total.failed, total.poisoned, total.other, until - since,
        total.total_ms / signals if signals else None, total.max_ms if signals else None,
        [(minute, tally.processed) for minute, tally in minutes.items()])
