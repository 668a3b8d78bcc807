"""Sessions in the simulation: what endpoint ``s`` must show once a run with sessions has
quiesced (``workload.SessionPlan`` says what was sent, ``bus.protocol.sessions.order`` the rules).

1. Every Tally's effect is applied exactly once - or, never applied, its copy is in the
   poison queue for a reason its session accounts for: its handler rejects it on every
   delivery (the doomed Tally), it came after its session had skipped its number (at an
   endpoint that skips gaps, or after the operator's skip), or after the operator closed its
   session; or the operator purged its entry.
2. Per stream, effects in sequence order: each effect row names the number its session had
   handled last in that stream, which must be the stream's previous number - or every number
   between them skipped, in a gap the session row records. A skipped number is never handled.
3. Each session's state agrees with its effects: its count (and the row's), the last number
   per stream, the partition's counter - no lost update, no progress without its effect.
4. Nothing waits in a session (a closed one may still list copies it released, each then
   poisoned); a session is closed when, and only when, the plan closes it and all its
   Tallies were handled - or the operator closed it.
5. Every number a handler's stream gave (its partition's slot counts them) was handled or is
   in the poison queue: a handler's copies are never lost, so no gap of theirs is real.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from bus import Bus
from bus.adapters.memory import InMemoryStorage
from bus.protocol.outbox.slot import Outbox
from bus.protocol.poison.queue import PoisonEntry
from bus.protocol.sessions.order import (
    SESSION_ROW,
    SessionRow,
    Waiting,
    client_stream,
    counter_partition,
    decode,
    stream_key,
)
from bus.testing.simulate.entries import whole_entry
from bus.testing.simulate.workload import SessionPlan

ENDPOINT = "s"
SENDERS = ("b", "e")
"""The endpoints whose handlers send Tallies (a stream per partition)."""
SKIPPED = "(skipped as a gap)"
"""How the reason of a copy that came after its session skipped its number ends."""
CLOSED = "was closed before this message arrived"
REFUSED = (SKIPPED, CLOSED, "is already taken by message")
REJECTED = "rejected: "


def settled(entry: PoisonEntry) -> bool:
    """Whether a poisoned message is one the operator leaves where it is: a copy its session
    refused, or one its handler rejected (replayed, either would only be poisoned again)."""
    return entry.reason.startswith(REJECTED) or any(part in entry.reason for part in REFUSED)


@dataclass(frozen=True)
class Applied:
    """One Tally's effect row."""

    label: str
    session: str
    stream: str  # "" when its sender did not number it (send_once)
    sequence: int
    prev: int
    generation: int  # how often its copy was set aside before it was handled
    partition: str


@dataclass(frozen=True)
class Letter:
    """One Tally in the poison queue of ``s``."""

    label: str
    session: str
    stream: str | None
    sequence: int | None
    reason: str


@dataclass(frozen=True)
class Found:
    """What ``s`` holds at the end of a run."""

    applied: list[Applied]
    letters: list[Letter]
    rows: dict[str, SessionRow]
    counters: dict[str, int]  # partition -> its counter row
    numbered: dict[tuple[str, str], int]  # (session, handler stream) -> numbers it gave
    client: str  # the client's stream

    def skipped(self, session: str, stream: str) -> set[int]:
        row = self.rows.get(session)
        return {n for gap in (row.gaps if row else ()) if gap.stream == stream
                for n in range(gap.first, gap.last + 1)}


def look(bus: Bus, storage: InMemoryStorage, plan: SessionPlan) -> Found:
    table = bus.names.state_table(ENDPOINT)
    applied: list[Applied] = []
    rows: dict[str, SessionRow] = {}
    counters: dict[str, int] = {}
    for row in storage.tables.rows(table):
        p = row.properties
        if row.row_key.startswith("tally."):
            applied.append(Applied(str(p["label"]), str(p["session"]), str(p["stream"]),
                                   _int(p["sequence"]), _int(p["prev"]),
                                   _int(p["generation"]), row.partition_key))
        elif row.row_key.startswith(SESSION_ROW):
            rows[row.row_key[len(SESSION_ROW):]] = decode(row.partition_key, p)
        elif row.row_key == "counter":
            counters[row.partition_key] = _int(p["n"])
    return Found(applied, _letters(bus, storage), rows, counters, _numbered(bus, storage, plan),
                 client_stream(bus.settings.client_name))


def _letters(bus: Bus, storage: InMemoryStorage) -> list[Letter]:
    letters: list[Letter] = []
    for body in storage.queues.bodies(bus.names.poison_queue(ENDPOINT)):
        envelope = whole_entry(storage, body).envelope
        if envelope is None or envelope.message_type != "Tally":
            continue
        payload = json.loads(envelope.payload or "{}")
        letters.append(Letter(str(payload["label"]), str(payload["session"]), envelope.stream,
                              envelope.sequence, whole_entry(storage, body).reason))
    return letters


def _numbered(bus: Bus, storage: InMemoryStorage,
              plan: SessionPlan) -> dict[tuple[str, str], int]:
    """How many numbers each stream gave each session: a handler's, its slot's counters; the
    client's, its counter rows."""
    numbered: dict[tuple[str, str], int] = {}
    client = client_stream(bus.settings.client_name)
    for key in plan.keys:
        row = storage.tables.stored(bus.names.ledger_table,
                                    counter_partition(client, ENDPOINT, key), "counter")
        if row is not None and _int(row.properties["n"]):
            numbered[(key, client)] = _int(row.properties["n"])
    for sender in SENDERS:
        for slot in Outbox(storage.tables, bus.names.state_table(sender)).pending():
            assert slot.record is not None
            for key in plan.keys:
                n = slot.record.sequences.get(stream_key(ENDPOINT, key), 0)
                if n:
                    numbered[(key, f"{sender}/{slot.partition}")] = n
    return numbered


def _int(value: object) -> int:
    assert isinstance(value, int)
    return value


# -- the invariants ------------------------------------------------------------------------
def check(found: Found, plan: SessionPlan, roots: int) -> list[str]:
    return [*_exactly_once(found, plan, plan.labels(roots)), *_in_order(found),
            *_states(found, plan), *_numbers(found, plan), *_gaps(found, plan)]


def _exactly_once(found: Found, plan: SessionPlan, labels: dict[str, str]) -> list[str]:
    """1: each Tally applied once, or poisoned for a reason its session accounts for."""
    violations: list[str] = []
    applied = Counter(e.label for e in found.applied)
    letters: dict[str, list[Letter]] = defaultdict(list)
    for letter in found.letters:
        letters[letter.label].append(letter)
    for label in labels:
        n, poisoned = applied.pop(label, 0), letters.pop(label, [])
        if n == 1 and not poisoned:
            continue
        if n == 0 and poisoned:
            violations.extend(f"Tally {label} poisoned: {letter.reason}" for letter in poisoned
                              if not _accounted(letter, found, plan))
            if len(poisoned) > 1:  # one message, one entry: counts and replays stay true
                violations.append(f"Tally {label} poisoned {len(poisoned)} times: "
                                  + "; ".join(letter.reason for letter in poisoned))
        elif n == 0:
            if label not in plan.purged:  # purged: the operator's to account for
                violations.append(f"Tally {label} lost")
        else:
            violations.append(f"Tally {label} applied {n} times"
                              f"{' and poisoned' if poisoned else ''}")
    violations.extend(f"unexpected Tally effect {label}" for label in applied)
    violations.extend(f"unexpected Tally {label} in the poison queue" for label in letters)
    return violations


def _accounted(letter: Letter, found: Found, plan: SessionPlan) -> bool:
    """Whether a Tally's poisoned message is one its session explains: the doomed one rejected,
    one whose number its session had skipped (the endpoint skipping gaps, or the operator),
    or one of a session the operator closed, once it was closed."""
    if letter.reason.startswith(REJECTED):
        return letter.label == plan.doomed
    if CLOSED in letter.reason:
        row = found.rows.get(letter.session)
        return letter.session in plan.closed_by_operator and row is not None and row.closed
    if not letter.reason.endswith(SKIPPED) or letter.stream is None:
        return False
    return (plan.skip_gaps or letter.session in plan.skipped_by_operator) and (
        letter.sequence in found.skipped(letter.session, letter.stream))


def _in_order(found: Found) -> list[str]:
    """2: per stream, each effect after its stream's previous number (or a recorded gap)."""
    violations: list[str] = []
    streams: dict[tuple[str, str], list[Applied]] = defaultdict(list)
    for effect in found.applied:
        if effect.stream:
            streams[(effect.session, effect.stream)].append(effect)
    for (session, stream), effects in sorted(streams.items()):
        skipped = found.skipped(session, stream)
        last = 0
        for effect in sorted(effects, key=lambda e: e.sequence):
            where = f"session {session}, stream {stream}"
            if effect.prev != last:
                violations.append(f"{where}: {effect.sequence} handled after {effect.prev}, "
                                  f"not after {last}")
            missing = [n for n in range(last + 1, effect.sequence) if n not in skipped]
            if missing:
                violations.append(f"{where}: {effect.sequence} handled while {missing} were "
                                  "neither handled nor skipped")
            if effect.sequence in skipped:
                violations.append(f"{where}: {effect.sequence} handled though skipped")
            last = effect.sequence
    return violations


def _states(found: Found, plan: SessionPlan) -> list[str]:
    """3 and 4: the sessions' state and rows agree with their effects."""
    violations: list[str] = []
    per_partition = Counter(e.partition for e in found.applied)
    violations.extend(f"{ENDPOINT}/{partition}: counter {found.counters.get(partition)} but "
                      f"{n} Tally effects (lost update)" for partition, n in per_partition.items()
                      if found.counters.get(partition) != n)
    for key in plan.keys:
        effects = [e for e in found.applied if e.session == key]
        row = found.rows.get(key, SessionRow())
        last: dict[str, int] = {}
        for effect in effects:
            if effect.stream:
                last[effect.stream] = max(last.get(effect.stream, 0), effect.sequence)
        if (row.state.get("count", 0), row.handled) != (len(effects), len(effects)):
            violations.append(f"session {key}: its state counts {row.state.get('count', 0)}, "
                              f"its row {row.handled}, but {len(effects)} effects (lost update)")
        if row.state.get("last", {}) != last:
            violations.append(f"session {key}: its state's last numbers "
                              f"{row.state.get('last', {})} but its effects' {last}")
        # A closed session released what waited in it: each copy came back and was poisoned
        # (its entry in the poison queue), though the row still lists it.
        poisoned = {(letter.stream, letter.sequence) for letter in found.letters
                    if letter.session == key} | {
            (stream, sequence) for session, stream, sequence in plan.purged.values()
            if session == key} if row.closed else set()
        waiting = [w for w in row.waiting if (w.stream, w.sequence) not in poisoned]
        if waiting:
            violations.append(f"session {key}: {len(waiting)} copies still waiting, the "
                              f"first {_first(waiting)}")
        closing = plan.close and 0 < len(effects) == plan.totals[key]
        if row.closed != closing and key not in plan.closed_by_operator:
            violations.append(f"session {key}: {'closed' if row.closed else 'open'} after "
                              f"{len(effects)} of {plan.totals[key]} Tallies")
    return violations


def _first(waiting: Iterable[Waiting]) -> str:
    first = min(waiting, key=lambda w: w.sequence)
    return f"{first.sequence} of {first.stream}"


def _numbers(found: Found, plan: SessionPlan) -> list[str]:
    """5: every number a stream gave was handled or is in the poison queue (or was, until the
    operator purged it) - the client's too, unless one of its numbered sends to that session
    raised (its number may be lost: a gap); a send refused for a full queue takes none."""
    accounted = {(e.session, e.stream, e.sequence) for e in found.applied} | {
        (letter.session, letter.stream, letter.sequence) for letter in found.letters} | set(
        plan.purged.values())
    return [f"session {session}: number {n} of stream {stream} neither handled nor in the "
            f"poison queue" for (session, stream), given in sorted(found.numbered.items())
            if stream != found.client or session not in plan.numbering_failed
            for n in range(1, given + 1) if (session, stream, n) not in accounted]


def _gaps(found: Found, plan: SessionPlan) -> list[str]:
    """Gaps are skipped only at an endpoint that skips them, or by the operator."""
    if plan.skip_gaps:
        return []
    return [f"session {key}: gap {gap.first}-{gap.last} of {gap.stream} skipped at an "
            "endpoint that blocks" for key, row in sorted(found.rows.items())
            for gap in row.gaps if key not in plan.skipped_by_operator]


def statistics(found: Found) -> Counter[str]:
    """What the run's sessions went through, for the report."""
    return Counter(
        session_messages=len(found.applied),
        sessions_set_aside=sum(e.generation > 0 for e in found.applied),
        sessions_closed=sum(row.closed for row in found.rows.values()),
        gaps_skipped=sum(len(row.gaps) for row in found.rows.values()),
        sessions_refused=sum(letter.reason.endswith(SKIPPED) for letter in found.letters))
