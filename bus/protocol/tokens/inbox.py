"""Inbox tokens: one row per in-flight message copy, created by the sender before the signal.

The inbox is inverted: it holds the messages that are *not yet* processed, keyed by
attempt id, so its size equals the number of messages in flight. A receiver processes a copy only
while its token is live, and consumes (deletes) the token once the effect is committed.

A token row is one of these:

* ``live``     - the message is in flight;
* ``pending``  - created by a handler's worker *before* its commit (``dispatch``): in flight if
                 that commit happened (a signal is only ever sent after it), an orphan if it
                 did not. The row names its origin (endpoint, partition, incoming attempt), and
                 finishing the origin's record confirms it (pending -> live) before the slot
                 can move on, which is what lets the sweeper tell orphans apart (``sweeper``);
* ``fenced``   - a tombstone for an attempt id that was superseded: it will never be signalled,
                 and a delayed ("ghost") create of it now fails with 409 instead of resurrecting it;
* ``poisoned``   - the message went to the poison queue; kept for the poison-queue tools. A token
                 the sweeper poisoned because no signal had come for it is marked ``orphan``:
                 if its signal arrives after all, the copy is processed;
* ``deferred`` - a handler set the message aside (``Context.defer``): no copy of it is
                 processed until someone releases it (``bus.protocol.outbox.deferral``).
                 The row keeps the signal to send again, and an index row
                 ``~deferred~<message id>`` in the same partition finds it by message id.

An endpoint's tokens lie in several partitions, the shard each attempt id names
(``bus.protocol.tokens.shards``): the methods here take the endpoint and find the partition, and
split a batch whose tokens lie in several into one request per partition.

A token's ``generation`` counts its releases: an outbox record that deferred the message
remembers the generation it saw, so once the message is released the old record no longer
counts as unfinished (``finished``).
"""

from __future__ import annotations

import contextlib
import enum
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from bus.envelope import Envelope
from bus.protocol.records import OutboxRecord
from bus.protocol.tokens.shards import endpoint_of, partition, partitions, shard_of
from bus.storage import (
    Conflict,
    Entity,
    EntityValue,
    NotFound,
    PreconditionFailed,
    StorageError,
    TableOp,
    Tables,
)
from bus.storage.limits import StorageLimits, split_text

log = logging.getLogger(__name__)

Requests = Callable[[Sequence[Callable[[], dict[str, Entity]]]], list[dict[str, Entity]]]
"""Runs a list of reads and returns their results in order (one after another, or at once)."""


def _one_by_one(reads: Sequence[Callable[[], dict[str, Entity]]]) -> list[dict[str, Entity]]:
    return [read() for read in reads]


_INDEX = "~deferred~"  # row key prefix of the deferral index (attempt ids never contain ~)
_MARK = "~sent~"  # row key prefix of send marks (``bus.protocol.send.marked``)
_NOT_A_TOKEN = "~"  # rows whose key starts so are not tokens: attempt ids never hold "~"
MARK_LOG = "~marks"  # the partition of the send marks' log (``marklog``; no endpoint's name)


class TokenState(str, enum.Enum):
    LIVE = "live"
    PENDING = "pending"
    FENCED = "fenced"
    POISONED = "poisoned"
    DEFERRED = "deferred"

    @classmethod
    def _missing_(cls, value: object) -> TokenState | None:
        # Rows written before the state took the name it has everywhere else.
        return cls.POISONED if value == STORED_BEFORE else None


STORED_BEFORE = "parked"
"""What earlier versions stored for ``POISONED``: read as poisoned, never written."""


@dataclass(frozen=True)
class Origin:
    """Where a pending token came from: the outbox slot of the record that lists it."""

    endpoint: str
    partition: str
    attempt_id: str  # the record's incoming attempt id


@dataclass(frozen=True)
class Lineage:
    """What a token says of its message for the operators' tools (the dashboard's
    conversation view finds in-flight messages by it): its conversation, its cause, its type
    and its sender. Written with the token, in the same request; absent on tokens written
    before it was kept."""

    correlation_id: str
    causation_id: str | None
    message_type: str
    source: str

    @classmethod
    def of(cls, envelope: Envelope) -> Lineage:
        return cls(envelope.correlation_id, envelope.causation_id, envelope.message_type,
                   envelope.source)


@dataclass(frozen=True)
class Token:
    endpoint: str
    attempt_id: str
    state: TokenState
    message_id: str
    since: float  # when it entered its state (clock seconds)
    etag: str
    generation: int = 0  # releases from deferral so far
    signal: str | None = None  # the signal body, kept while deferred (and after a release)
    origin: Origin | None = None  # pending tokens only
    due: float | None = None
    """When a scheduled message's signal becomes visible (epoch seconds); None: at once."""
    orphan: bool = False
    """Poisoned by the sweeper because no signal had come for it (``sweeper``): presumed an
    orphan, which its signal disproves by arriving - the copy is then processed."""
    lineage: Lineage | None = None
    poisoned_by: str | None = None
    """What a poisoning recorded of the copy it poisoned the token for: its digest
    (``bus.protocol.poison.queue.signal_digest``), so that a replay sends that copy and no
    other with the same ids (kept while the token lives on: a replay revives it)."""
    recoveries: int = 0
    """Automatic replays after the Functions host moved the message to the poison queue
    without a handler failure (a crash: ``bus.protocol.poison.poisoned``), so far."""

    @property
    def processable(self) -> bool:
        """Whether a copy of the message may be processed (live, or pending: a signal exists
        only once the record that lists the token is committed; or poisoned as a presumed
        orphan: a copy arriving disproves it)."""
        return self.state in (TokenState.LIVE, TokenState.PENDING) or (
            self.state is TokenState.POISONED and self.orphan)


@dataclass(frozen=True)
class Mark:
    """A send mark (``bus.protocol.send.marked``): the copy of ``message_id`` sent to ``endpoint``
    has the token ``attempt_id``; made at ``at`` (clock seconds)."""

    endpoint: str
    message_id: str
    attempt_id: str
    at: float
    etag: str = ""
    origin: str = ""
    """Who made it, as the sender named itself (a Spark job: its id)."""
    signalled: bool = False
    """Whether a signal of its token was sent (noted after the send answered): a call made
    again leaves the token to that signal instead of sending another."""


@dataclass(frozen=True)
class StaleIndex:
    """A deferral index row whose token is gone, as read (``etag``)."""

    endpoint: str
    message_id: str
    etag: str
    partition: str = ""
    """The partition the row is in (its token's shard); "" for the endpoint's own."""


class Inbox:
    def __init__(self, tables: Tables, table: str) -> None:
        self._tables = tables
        self._table = table


    def create(self, endpoint: str, attempt_id: str, message_id: str, now: float,
               due: float | None = None, *, lineage: Lineage | None = None) -> None:
        """Create a live token (``due``: when its signal becomes visible, for a scheduled
        message). Attempt ids are fresh, so a 409 means our own earlier request took effect
        (its response was lost) - or the attempt was fenced, which the caller's next
        compare-and-swap on its outbox slot detects."""
        entity = self._entity(Token(endpoint, attempt_id, TokenState.LIVE, message_id, now, "",
                                    due=due, lineage=lineage))
        with contextlib.suppress(Conflict):
            self._tables.insert(self._table, entity)

    def create_many(self, endpoint: str, tokens: Sequence[tuple[str, str]], now: float,
                    origins: Sequence[Origin] | None = None,
                    dues: Sequence[float | None] | None = None, *,
                    lineages: Sequence[Lineage | None] | None = None) -> list[str]:
        """Create tokens ``(attempt id, message id)`` of one endpoint, 100 per request; live,
        or pending when ``origins`` (one per token) are given; ``dues`` and ``lineages`` as
        for ``create``. Returns their ETags.

        Only for fresh attempt ids nobody else knows yet (a committer's own). Any error leaves
        the outcome unknown: the caller must not use these attempt ids again (it completes its
        record the way a helper does, with fresh ones; pending ones are the sweeper's).
        """
        etags = [""] * len(tokens)
        per = self._tables.limits.transaction_operations
        for indexes in _by_partition(endpoint, [attempt_id for attempt_id, _ in tokens]):
            for start in range(0, len(indexes), per):
                chunk = indexes[start:start + per]
                ops = [TableOp("insert", self._entity(Token(
                    endpoint, tokens[i][0], TokenState.PENDING if origins else TokenState.LIVE,
                    tokens[i][1], now, "", origin=origins[i] if origins else None,
                    due=dues[i] if dues else None, lineage=lineages[i] if lineages else None)))
                    for i in chunk]
                for i, etag in zip(chunk, self._tables.transact(self._table, ops), strict=True):
                    etags[i] = etag
        return etags

    def confirm_many(self, endpoint: str, tokens: Sequence[tuple[str, str, str]],
                     now: float, *, dues: Sequence[float | None] | None = None,
                     lineages: Sequence[Lineage | None] | None = None) -> None:
        """Make pending tokens ``(attempt id, message id, ETag)`` of one endpoint live, 100 per
        request (one by one when a request fails); ``dues`` and ``lineages`` as they were
        created with (the row is replaced whole). A token that changed since (processed,
        poisoned, deferred) is left as it is: it is not pending any more, which is all this
        promises."""
        per = self._tables.limits.transaction_operations
        for indexes in _by_partition(endpoint, [attempt_id for attempt_id, _, _ in tokens]):
            for start in range(0, len(indexes), per):
                ops = [TableOp("replace", self._entity(Token(
                    endpoint, tokens[i][0], TokenState.LIVE, tokens[i][1], now, "",
                    due=dues[i] if dues else None,
                    lineage=lineages[i] if lineages else None)), tokens[i][2])
                    for i in indexes[start:start + per]]
                try:
                    self._tables.transact(self._table, ops)
                except (PreconditionFailed, NotFound):
                    for op in ops:
                        with contextlib.suppress(PreconditionFailed, NotFound):
                            self._tables.replace(self._table, op.entity, etag=op.etag)

    @property
    def limits(self) -> StorageLimits:
        """What the inbox table accepts (the table service's limits)."""
        return self._tables.limits

    def _entity(self, token: Token) -> Entity:
        return _entity(token, self._tables.limits.property_bytes)

    def read(self, endpoint: str, attempt_id: str) -> Token | None:
        try:
            row = self._tables.get(self._table, partition(endpoint, attempt_id), attempt_id)
        except NotFound:
            return None
        return _token(row)

    def read_many(self, endpoint: str, attempt_ids: list[str], *,
                  side_by_side: Requests = _one_by_one) -> dict[str, Token]:
        """The existing tokens among ``attempt_ids`` (all of one endpoint): one request per
        partition they lie in, made by ``side_by_side`` (a claim round's lanes: at once)."""
        unique = sorted(set(attempt_ids))

        def reading(keys: list[str]) -> Callable[[], dict[str, Entity]]:
            return lambda: self._tables.get_many(self._table, partition(endpoint, keys[0]), keys)

        groups = [[unique[i] for i in indexes] for indexes in _by_partition(endpoint, unique)]
        return {attempt_id: _token(row) for rows in side_by_side([reading(g) for g in groups])
                for attempt_id, row in rows.items()}

    def consume(self, endpoint: str, attempt_id: str) -> None:
        # gone already is fine
        self._tables.delete(self._table, partition(endpoint, attempt_id), attempt_id)

    def consume_many(self, endpoint: str, attempt_ids: Sequence[str]) -> None:
        """Consume tokens of one endpoint, 100 per request; one by one when a request fails
        (a token gone already fails a whole request). Deleting twice is harmless."""
        per = self._tables.limits.transaction_operations
        for indexes in _by_partition(endpoint, attempt_ids):
            for start in range(0, len(indexes), per):
                chunk = [attempt_ids[i] for i in indexes[start:start + per]]
                if len(chunk) == 1:  # a plain delete: cheaper than a transaction of one
                    self.consume(endpoint, chunk[0])
                    continue
                try:
                    self._tables.transact(self._table, [
                        TableOp("delete", Entity(partition(endpoint, attempt_id), attempt_id))
                        for attempt_id in chunk])
                except StorageError:
                    for attempt_id in chunk:
                        self.consume(endpoint, attempt_id)

    def fence(self, endpoint: str, attempt_id: str, message_id: str, now: float) -> None:
        """Turn a superseded attempt into a tombstone (whether or not its token exists)."""
        self.fence_many(endpoint, [attempt_id], message_id, now)

    def fence_many(self, endpoint: str, attempt_ids: Sequence[str], message_id: str,
                   now: float) -> None:
        """``fence`` for several attempts of one message at one endpoint, 100 per request:
        a record whose completion was retried many times has as many superseded attempts,
        and one request each would make finishing it ever less likely under faults."""
        per = self._tables.limits.transaction_operations
        unique = list(dict.fromkeys(attempt_ids))  # a transaction names each row once
        for indexes in _by_partition(endpoint, unique):
            for start in range(0, len(indexes), per):
                ops = [TableOp("replace", self._entity(
                    Token(endpoint, unique[i], TokenState.FENCED, message_id, now, "")))
                    for i in indexes[start:start + per]]
                if len(ops) == 1:
                    self._tables.replace(self._table, ops[0].entity)
                else:
                    self._tables.transact(self._table, ops)

    def poison(self, token: Token, now: float, *, orphan: bool = False,
               poisoned_by: str | None = None) -> bool:
        """Mark a live token as poisoned (``orphan``: presumed so by the sweeper;
        ``poisoned_by``: the digest of the copy poisoned, its entry's); False if it changed
        meanwhile (consumed, fenced)."""
        return self._move(replace(token, orphan=orphan,
                                  poisoned_by=poisoned_by or token.poisoned_by),
                          TokenState.POISONED, now)

    def confirm(self, token: Token, now: float) -> Token | None:
        """Make a pending token live, as its sender's confirmation would (``confirm_many``);
        the token as stored now, or None if it changed meanwhile."""
        live = replace(token, state=TokenState.LIVE, since=now, origin=None)
        try:
            etag = self._tables.replace(self._table, self._entity(live), etag=token.etag)
        except (PreconditionFailed, NotFound):
            return None
        return replace(live, etag=etag)

    def revive(self, token: Token, now: float, signal: str, *, recovery: bool = False,
               due: float | None = None) -> bool:
        """Make a token live again for a poison-queue replay - a poisoned one, or a live or
        pending one rewritten live, so that its ETag changes - carrying the ``signal`` the
        replay sends next (the sweeper sends it again if the replay stops before it does);
        ``recovery``: an automatic retry of a crashed message, counted on the token, whose
        signal is ``due`` then (the sweeper waits for it). False if it changed."""
        return self._move(replace(token, orphan=False, signal=signal,
                                  recoveries=token.recoveries + recovery,
                                  due=due if due is not None else token.due),
                          TokenState.LIVE, now)

    def defer(self, token: Token, signal: str, now: float) -> bool:
        """Set a live token aside with the signal to send when it is released, and index it by
        message id (one transaction); False if the token changed meanwhile."""
        deferred = replace(token, state=TokenState.DEFERRED, since=now, signal=signal)
        index = Entity(partition(token.endpoint, token.attempt_id), _INDEX + token.message_id,
                       {"attempt_id": token.attempt_id})
        try:
            self._tables.transact(self._table, [
                TableOp("replace", self._entity(deferred), token.etag), TableOp("replace", index)])
        except (PreconditionFailed, NotFound):
            return False
        return True

    def release(self, token: Token, now: float) -> Token | None:
        """Make a deferred token live again, one generation later (the signal is kept, so a
        release can be repeated); None if it changed meanwhile."""
        live = replace(token, state=TokenState.LIVE, since=now,
                       generation=token.generation + 1)
        try:
            etag = self._tables.replace(self._table, self._entity(live), etag=token.etag)
        except (PreconditionFailed, NotFound):
            return None
        return replace(live, etag=etag)

    def find(self, endpoint: str, message_id: str) -> Token | None:
        """The token a deferral of ``message_id`` indexed, if it still exists: the index of
        each shard read, and the token of each found. When several shards index the message
        (a deferred copy was superseded by another with a fresh attempt id, deferred in turn),
        the deferred token wins, then the one that changed state last."""
        found: list[Token] = []
        for key in partitions(endpoint):
            try:
                index = self._tables.get(self._table, key, _INDEX + message_id)
            except NotFound:
                continue
            token = self.read(endpoint, str(index.properties["attempt_id"]))
            if token is not None:
                found.append(token)
        return max(found, key=lambda t: (t.state is TokenState.DEFERRED, t.since), default=None)

    def _move(self, token: Token, state: TokenState, now: float) -> bool:
        try:
            self._tables.replace(self._table, self._entity(replace(token, state=state, since=now)),
                                 etag=token.etag)
        except (PreconditionFailed, NotFound):
            return False
        return True

    def all(self, endpoint: str | None = None) -> list[Token]:
        """Every token row, or one endpoint's (for tooling, the sweeper and the checks; not a
        hot path). A row that is not a token the bus wrote (an unknown state, a missing
        field: anyone who may insert tokens can write one) is logged and left out, so that
        one such row does not stop the sweeper or the operators' pages."""
        tokens: list[Token] = []
        # Tokens' row keys are attempt ids; the index rows and the send marks sort after
        # them ("~..."), and the service leaves them out: a sweep does not read every mark.
        rows = (self._tables.query(self._table, row_key_before=_NOT_A_TOKEN)
                if endpoint is None else
                [row for key in partitions(endpoint)
                 for row in self._tables.query(self._table, key,
                                               row_key_before=_NOT_A_TOKEN)])
        for row in rows:
            if row.partition_key == MARK_LOG:  # its row keys are moments, below "~" too
                continue
            try:
                tokens.append(_token(row))
            except (KeyError, ValueError, TypeError) as exc:
                log.warning("token row %s/%s of %s is not a token this bus wrote (%s): left "
                            "out", row.partition_key[:100], row.row_key[:100], self._table,
                            exc)
        return tokens

    # -- send marks (``bus.protocol.send.marked``) ----------------------------------------------
    def create_marked(self, endpoint: str, copies: Sequence[tuple[str, str, float | None]],
                      now: float, *, origin: str = "", together: bool = True,
                      marked: bool = True,
                      lineages: Sequence[Lineage | None] | None = None) -> list[Mark]:
        """For each copy ``(attempt id, message id, due)`` of one endpoint, a send mark and a
        live token, in one transaction (at most half the transaction's operations: the
        caller chunks); the marks as created. Conflict when a mark exists (none of them was
        created then).
        ``together`` off and ``marked`` off are breaks: the marks in a request before the
        tokens', and no marks.

        Marks and their tokens lie in the endpoint's shard 0, so that a mark is found by
        message id whatever the shards were when it was made: the attempt ids must name no
        shard (ValueError)."""
        if any(shard_of(attempt_id) for attempt_id, _, _ in copies):
            raise ValueError("marked copies' attempt ids must name no shard")
        marks = [TableOp("insert", _mark_entity(Mark(endpoint, message_id, attempt_id, now,
                                                     origin=origin), signalled=False))
                 for attempt_id, message_id, _ in copies]
        tokens = [TableOp("insert", self._entity(Token(
            endpoint, attempt_id, TokenState.LIVE, message_id, now, "", due=due,
            lineage=lineages[i] if lineages else None)))
            for i, (attempt_id, message_id, due) in enumerate(copies)]
        if not marked:
            self._tables.transact(self._table, tokens)
            return []
        if together:
            etags = self._tables.transact(self._table, [*marks, *tokens])
        else:
            etags = self._tables.transact(self._table, marks)
            self._tables.transact(self._table, tokens)
        # the marks' etags come first (the tokens' follow when they are in the same request)
        return [_mark(replace(op.entity, etag=etag))
                for op, etag in zip(marks, etags[:len(marks)], strict=True)]

    def note_signalled(self, marks: Sequence[Mark]) -> None:
        """Note on each mark (all of one endpoint) that its token's signal was sent, unless
        the mark changed since it was read or made (its ``etag``): one request per
        transaction's worth. A mark another call noted meanwhile, or one swept and made
        again for a new copy, keeps what it says; a request that fails with a storage error
        raises it (nothing is lost: a call made again sends one more signal)."""
        per = self._tables.limits.transaction_operations
        for start in range(0, len(marks), per):
            ops = [TableOp("replace", _mark_entity(mark, signalled=True), etag=mark.etag)
                   for mark in marks[start:start + per]]
            try:
                self._tables.transact(self._table, ops)
            except (PreconditionFailed, NotFound):  # one changed: the others one by one
                for op in ops:
                    with contextlib.suppress(PreconditionFailed, NotFound):
                        self._tables.replace(self._table, op.entity, etag=op.etag)

    def marks(self, endpoint: str, message_ids: Sequence[str]) -> dict[str, Mark]:
        """The send marks of ``message_ids`` at ``endpoint`` that exist, by message id (one
        request per ``keys_per_read`` ids)."""
        per = self._tables.limits.keys_per_read
        ids = sorted(set(message_ids))
        found: dict[str, Mark] = {}
        for start in range(0, len(ids), per):
            rows = self._tables.get_many(self._table, endpoint,
                                         [_MARK + m for m in ids[start:start + per]])
            for row in rows.values():
                mark = _mark(row)
                found[mark.message_id] = mark
        return found

    def all_marks(self) -> list[Mark]:
        """Every send mark (a scan of the whole table: for tooling; the sweeper reads the
        marks' log, ``marklog``)."""
        return [_mark(row) for row in self._tables.query(self._table)
                if row.row_key.startswith(_MARK)]

    def forget_mark(self, mark: Mark) -> bool:
        """Delete a send mark whose token is gone, unless the mark changed since it was read.
        A mark whose token still exists is kept however old: its message still waits, and
        without the mark a second send would create a second token. True when deleted."""
        if self.read(mark.endpoint, mark.attempt_id) is not None:
            return False
        try:
            self._tables.delete(self._table, mark.endpoint, _MARK + mark.message_id,
                                etag=mark.etag)
        except (PreconditionFailed, NotFound):
            return False
        return True

    def stale_index(self) -> list[StaleIndex]:
        """Index rows whose token is gone (for the sweeper).

        A scan is no snapshot (on Azure a query that spans pages reads each page at another
        moment), so each row the scan finds without its token is checked again by itself:
        its token read now, and the row dropped only if unchanged since (``drop_index``)."""
        rows = self._tables.query(self._table, row_key_prefix=_INDEX)
        if not rows:
            return []  # no deferral indexed: the tokens need no reading
        tokens = {(row.partition_key, row.row_key) for row in
                  self._tables.query(self._table, row_key_before=_NOT_A_TOKEN)}
        candidates = [row for row in rows
                      if (row.partition_key, str(row.properties["attempt_id"])) not in tokens]
        return [StaleIndex(endpoint_of(row.partition_key), row.row_key[len(_INDEX):], row.etag,
                           row.partition_key)
                for row in candidates
                if self.read(endpoint_of(row.partition_key),
                             str(row.properties["attempt_id"])) is None]

    def drop_index(self, stale: StaleIndex) -> None:
        """Drop an index row ``stale_index`` found, unless it changed since (a new deferral
        of the message id, pointing to another token)."""
        with contextlib.suppress(PreconditionFailed, NotFound):
            self._tables.delete(self._table, stale.partition or stale.endpoint,
                                _INDEX + stale.message_id, etag=stale.etag)

    def withdraw(self, endpoint: str, attempt_id: str, etag: str) -> None:
        """Delete a token if it is unchanged since ``etag`` (a pending token nobody will
        commit); gone or changed already is fine."""
        with contextlib.suppress(PreconditionFailed, NotFound):
            self._tables.delete(self._table, partition(endpoint, attempt_id), attempt_id,
                                etag=etag)

    def delete_if_unchanged(self, token: Token) -> None:
        with contextlib.suppress(PreconditionFailed):
            self._tables.delete(self._table, partition(token.endpoint, token.attempt_id),
                                token.attempt_id, etag=token.etag)


def finished(record: OutboxRecord, token: Token | None, *, poisoned_ends: bool = False) -> bool:
    """Whether an outbox record's work is done, given its incoming token (None: gone).

    A record is finished once its incoming token is consumed - or, for a record that deferred
    its message, once the token was set aside (or released since: a later generation). A
    poisoned token does not finish a deferring record: the message's effect is committed and
    the deferral still to apply (setting the token aside makes the poison entry stale), just
    as a poisoned token of any other committed record is still to consume. (``poisoned_ends``:
    the "poisoned-ends-deferral" break.)
    """
    if token is None:
        return True
    if record.deferred_signal is None:
        return False
    ended = (TokenState.DEFERRED, TokenState.FENCED,
             *((TokenState.POISONED,) if poisoned_ends else ()))
    return token.generation != record.generation or (
        token.state in ended and not (token.state is TokenState.POISONED and token.orphan))


def _mark(row: Entity) -> Mark:
    at = row.properties.get("at")
    attempt_id = str(row.properties["attempt_id"])
    return Mark(endpoint_of(row.partition_key), row.row_key[len(_MARK):], attempt_id,
                float(at) if isinstance(at, (int, float)) else 0.0, row.etag,
                str(row.properties.get("origin", "")),
                # the attempt id whose signal went: a mark made again for a new copy of the
                # message id is not taken for noted by a late note of the old one
                row.properties.get("signalled") == attempt_id)


def _mark_entity(mark: Mark, *, signalled: bool) -> Entity:
    properties: dict[str, EntityValue] = {"attempt_id": mark.attempt_id, "at": mark.at,
                                          "origin": mark.origin}
    if signalled:
        properties["signalled"] = mark.attempt_id
    return Entity(mark.endpoint, _MARK + mark.message_id, properties)


def _token(row: Entity) -> Token:
    endpoint = endpoint_of(row.partition_key)
    if partition(endpoint, row.row_key) != row.partition_key:  # not where the bus puts it
        raise ValueError(f"its attempt id names another shard than partition "
                         f"{row.partition_key[:100]!r}")
    props = row.properties
    since = props.get("since")
    generation = props.get("generation", 0)
    chunks = props.get("signal_chunks", 0)
    signal = ("".join(str(props[f"s{i}"]) for i in range(chunks))
              if isinstance(chunks, int) and chunks else None)
    origin = (Origin(str(props["origin_endpoint"]), str(props["origin_partition"]),
                     str(props["origin_attempt"])) if "origin_endpoint" in props else None)
    due = props.get("due")
    recoveries = props.get("recoveries", 0)
    return Token(endpoint, row.row_key, TokenState(str(props["state"])),
                 str(props.get("message_id", "")),
                 float(since) if isinstance(since, (int, float)) else 0.0, row.etag,
                 generation if isinstance(generation, int) else 0, signal, origin,
                 float(due) if isinstance(due, (int, float)) else None,
                 props.get("orphan") is True, _lineage(props), _digest(props.get("poisoned_by")),
                 recoveries if isinstance(recoveries, int) and recoveries > 0 else 0)


def _digest(value: EntityValue | None) -> str | None:
    return value if isinstance(value, str) and re.fullmatch(r"[0-9a-f]{64}", value) else None


def _lineage(props: Mapping[str, EntityValue]) -> Lineage | None:
    if "correlation_id" not in props:
        return None
    causation = props.get("causation_id")
    return Lineage(str(props["correlation_id"]),
                   str(causation) if causation is not None else None,
                   str(props.get("message_type", "")), str(props.get("source", "")))


def _entity(token: Token, property_bytes: int) -> Entity:
    properties: dict[str, EntityValue] = {
        "state": token.state.value, "message_id": token.message_id, "since": token.since}
    if token.generation:
        properties["generation"] = token.generation
    if token.signal:
        chunks = split_text(token.signal, property_bytes)
        properties["signal_chunks"] = len(chunks)
        properties.update({f"s{i}": chunk for i, chunk in enumerate(chunks)})
    if token.due is not None:
        properties["due"] = token.due
    if token.orphan and token.state is TokenState.POISONED:
        properties["orphan"] = True
    if token.lineage is not None:
        properties.update({"correlation_id": token.lineage.correlation_id,
                           "message_type": token.lineage.message_type,
                           "source": token.lineage.source})
        if token.lineage.causation_id is not None:
            properties["causation_id"] = token.lineage.causation_id
    if token.poisoned_by is not None:
        properties["poisoned_by"] = token.poisoned_by
    if token.recoveries:
        properties["recoveries"] = token.recoveries
    if token.origin is not None:
        properties.update({"origin_endpoint": token.origin.endpoint,
                           "origin_partition": token.origin.partition,
                           "origin_attempt": token.origin.attempt_id})
    return Entity(partition(token.endpoint, token.attempt_id), token.attempt_id, properties)


def _by_partition(endpoint: str, attempt_ids: Sequence[str]) -> list[list[int]]:
    """The positions of ``attempt_ids`` grouped by their tokens' partition, each group in
    order, the groups in the order their first id comes."""
    groups: dict[str, list[int]] = {}
    for i, attempt_id in enumerate(attempt_ids):
        groups.setdefault(partition(endpoint, attempt_id), []).append(i)
    return list(groups.values())
