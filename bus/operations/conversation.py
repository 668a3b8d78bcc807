"""A conversation: the messages that share a correlation id, and where each one is.

Found in what storage holds, without an index of its own (no extra request per message):

* **inbox tokens** - every message in flight has one, and a token keeps its message's
  correlation id, cause, type and sender (``Lineage``): ``queued`` (live or pending),
  ``scheduled`` (not due yet), ``deferred``, ``poisoned`` (in the poison queue);
* **poison queues** - each entry's envelope;
* **outbox records** - each state partition's last committed record: its incoming message
  was handled (``processed``), and it lists the messages that handler sent, with their
  correlation and causation ids.

A message whose token is gone was processed (a consumed token is deleted). What storage no
longer holds is not shown: a processed message whose partition has committed another record
since, and whose own sends are gone too, and messages older than its traces (Application
Insights keeps those: docs/observability.md). The view is a snapshot: scans of the tokens
table, of every state table's slot rows and of the poison queues (briefly leased while read).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from bus.bus import Bus
from bus.envelope import Envelope
from bus.protocol.outbox.slot import Outbox
from bus.protocol.tokens.inbox import Token, TokenState

STATES = ("queued", "scheduled", "deferred", "poisoned", "processed", "unknown")


@dataclass(frozen=True)
class ConversationMessage:
    message_id: str
    message_type: str
    source: str
    destination: str
    causation_id: str | None
    state: str
    """One of ``STATES``."""
    since: float | None
    """When it entered that state (epoch seconds), when known."""
    attempt_id: str | None


@dataclass(frozen=True)
class Conversation:
    id: str
    """What was asked for: a message id or a correlation id."""
    correlation_id: str | None
    """None when nothing was found."""
    messages: list[ConversationMessage]
    """By causation: each message after the one that caused it."""


@dataclass(frozen=True)
class _Seen:
    message: ConversationMessage
    correlation_id: str | None
    rank: int
    """How much to trust it: a token (3) over a poison entry (2) over a record (1)."""


def conversation(bus: Bus, id: str) -> Conversation:
    """The conversation ``id`` names: as a message id (its conversation), else as a
    correlation id."""
    now = bus.parts.clock()
    tokens = [t for t in bus.parts.inbox.all() if t.state is not TokenState.FENCED]
    live = {(t.endpoint, t.message_id): t for t in tokens}
    seen = [*_from_tokens(tokens, now), *_from_poison(bus, live),
            *_from_records(bus, live, now)]
    correlation = next((s.correlation_id for s in seen
                        if s.message.message_id == id and s.correlation_id), None)
    correlation = correlation or (id if any(s.correlation_id == id for s in seen) else None)
    if correlation is None:
        return Conversation(id, None, [])
    ours = [s for s in seen if s.correlation_id == correlation]
    ids = {s.message.message_id for s in ours}
    ours += [s for s in seen if s.correlation_id is None and s.message.message_id in ids]
    return Conversation(id, correlation, _ordered(_merged(ours)))


def _from_tokens(tokens: Iterable[Token], now: float) -> list[_Seen]:
    found = []
    for token in tokens:
        lineage = token.lineage
        state = {TokenState.DEFERRED: "deferred", TokenState.POISONED: "poisoned"}.get(
            token.state, "scheduled" if token.due is not None and token.due > now else "queued")
        if token.state is TokenState.POISONED and token.orphan:
            state = "queued"  # presumed an orphan by the sweeper: its signal may yet come
        found.append(_Seen(ConversationMessage(
            token.message_id, lineage.message_type if lineage else "",
            lineage.source if lineage else "", token.endpoint,
            lineage.causation_id if lineage else None, state, token.since, token.attempt_id),
            lineage.correlation_id if lineage else None, 3))
    return found


def _from_poison(bus: Bus, live: dict[tuple[str, str], Token]) -> list[_Seen]:
    found = []
    for endpoint in bus.topology.endpoints:
        for letter in bus.poisoned(endpoint).entries(adopt=False):  # a read changes nothing
            envelope = letter.entry.envelope
            if envelope is None:
                continue
            poisoned = (endpoint, envelope.message_id) in live
            found.append(_Seen(_message(envelope, "poisoned" if poisoned else "processed",
                                        letter.entry.poisoned_at.timestamp()),
                               envelope.correlation_id, 2))
    return found


def _from_records(bus: Bus, live: dict[tuple[str, str], Token], now: float) -> list[_Seen]:
    found = []
    for endpoint in bus.topology.endpoints:
        for slot in Outbox(bus.storage.tables, bus.names.state_table(endpoint)).pending():
            record = slot.record
            assert record is not None
            correlation = record.outgoing[0].correlation_id if record.outgoing else None
            found.append(_Seen(ConversationMessage(
                record.message_id, record.message_type or "", "", endpoint, None, "processed",
                record.committed_at, record.attempt_id), correlation, 1))
            for envelope in record.outgoing:
                token = live.get((envelope.destination, envelope.message_id))
                state = "queued" if token is not None else "processed"
                if token is None and envelope.not_before and envelope.not_before.timestamp() > now:
                    state = "unknown"  # not sent yet, or processed: the record cannot tell
                found.append(_Seen(_message(envelope, state, None), envelope.correlation_id, 1))
    return found


def _message(envelope: Envelope, state: str, since: float | None) -> ConversationMessage:
    return ConversationMessage(envelope.message_id, envelope.message_type, envelope.source,
                               envelope.destination, envelope.causation_id, state, since,
                               envelope.attempt_id)


def _merged(seen: list[_Seen]) -> list[ConversationMessage]:
    """One message per (message id, destination): the most trusted sighting's state, with
    the details any sighting knows."""
    best: dict[tuple[str, str], _Seen] = {}
    for s in seen:
        key = (s.message.message_id, s.message.destination)
        old = best.get(key)
        if old is None:
            best[key] = s
            continue
        keep, other = (s, old) if s.rank > old.rank else (old, s)
        m, o = keep.message, other.message
        best[key] = replace(keep, message=replace(
            m, message_type=m.message_type or o.message_type, source=m.source or o.source,
            causation_id=m.causation_id or o.causation_id))
    return [s.message for s in best.values()]


def _ordered(messages: list[ConversationMessage]) -> list[ConversationMessage]:
    """Causes before what they caused; otherwise by message id."""
    by_id = {m.message_id for m in messages}
    roots = sorted((m for m in messages if m.causation_id not in by_id),
                   key=lambda m: (m.message_id, m.destination))
    ordered: list[ConversationMessage] = []
    queue = list(roots)
    while queue:
        current = queue.pop(0)
        ordered.append(current)
        queue += sorted((m for m in messages if m.causation_id == current.message_id
                         and m not in ordered and m not in queue),
                        key=lambda m: (m.message_id, m.destination))
    return ordered + [m for m in messages if m not in ordered]
