"""Inbox tokens: one row per in-flight message copy, created by the sender before the signal.

The inbox is inverted (seed 000): it holds the messages that are *not yet* processed, keyed by
attempt id, so its size equals the number of messages in flight. A receiver processes a copy only
while its token is live, and consumes (deletes) the token once the effect is committed.

A token row is one of three things:

* ``live``     - the message is in flight;
* ``fenced``   - a tombstone for an attempt id that was superseded: it will never be signalled,
                 and a delayed ("ghost") create of it now fails with 409 instead of resurrecting it;
* ``parked``   - the message went to the poison queue; kept for the dead-letter tools.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Sequence
from dataclasses import dataclass

from bus.storage import (
    Conflict,
    Entity,
    NotFound,
    PreconditionFailed,
    StorageError,
    TableOp,
    Tables,
)

_BATCH = 100  # operations per entity-group transaction (the Azure limit)


class TokenState(str, enum.Enum):
    LIVE = "live"
    FENCED = "fenced"
    PARKED = "parked"


@dataclass(frozen=True)
class Token:
    endpoint: str
    attempt_id: str
    state: TokenState
    message_id: str
    since: float  # when it entered its state (clock seconds)
    etag: str


class Inbox:
    def __init__(self, tables: Tables, table: str) -> None:
        self._tables = tables
        self._table = table

    def create(self, endpoint: str, attempt_id: str, message_id: str, now: float) -> None:
        """Create a live token. Attempt ids are fresh, so a 409 means our own earlier request
        took effect (its response was lost) - or the attempt was fenced, which the caller's
        next compare-and-swap on its outbox slot detects."""
        entity = _entity(endpoint, attempt_id, TokenState.LIVE, message_id, now)
        with contextlib.suppress(Conflict):
            self._tables.insert(self._table, entity)

    def create_many(self, endpoint: str, tokens: Sequence[tuple[str, str]], now: float) -> None:
        """Create live tokens ``(attempt id, message id)`` of one endpoint, 100 per request.

        Only for fresh attempt ids nobody else knows yet (a committer's own). Any error leaves
        the outcome unknown: the caller must not use these attempt ids again (it completes its
        record the way a helper does, with fresh ones).
        """
        for start in range(0, len(tokens), _BATCH):
            ops = [TableOp("insert", _entity(endpoint, attempt_id, TokenState.LIVE,
                                             message_id, now))
                   for attempt_id, message_id in tokens[start:start + _BATCH]]
            self._tables.transact(self._table, ops)

    def read(self, endpoint: str, attempt_id: str) -> Token | None:
        try:
            row = self._tables.get(self._table, endpoint, attempt_id)
        except NotFound:
            return None
        return _token(row)

    def read_many(self, endpoint: str, attempt_ids: list[str]) -> dict[str, Token]:
        """The existing tokens among ``attempt_ids`` (all of one endpoint): one request."""
        rows = self._tables.get_many(self._table, endpoint, sorted(set(attempt_ids)))
        return {attempt_id: _token(row) for attempt_id, row in rows.items()}

    def consume(self, endpoint: str, attempt_id: str) -> None:
        self._tables.delete(self._table, endpoint, attempt_id)  # gone already is fine

    def consume_many(self, endpoint: str, attempt_ids: Sequence[str]) -> None:
        """Consume tokens of one endpoint, 100 per request; one by one when a request fails
        (a token gone already fails a whole request). Deleting twice is harmless."""
        for start in range(0, len(attempt_ids), _BATCH):
            chunk = attempt_ids[start:start + _BATCH]
            try:
                self._tables.transact(self._table, [
                    TableOp("delete", Entity(endpoint, attempt_id)) for attempt_id in chunk])
            except StorageError:
                for attempt_id in chunk:
                    self.consume(endpoint, attempt_id)

    def fence(self, endpoint: str, attempt_id: str, message_id: str, now: float) -> None:
        """Turn a superseded attempt into a tombstone (whether or not its token exists)."""
        self._tables.replace(
            self._table, _entity(endpoint, attempt_id, TokenState.FENCED, message_id, now))

    def park(self, token: Token, now: float) -> bool:
        """Mark a live token as poisoned; False if it changed meanwhile (consumed, fenced)."""
        entity = _entity(token.endpoint, token.attempt_id, TokenState.PARKED,
                         token.message_id, now)
        try:
            self._tables.replace(self._table, entity, etag=token.etag)
        except (PreconditionFailed, NotFound):
            return False
        return True

    def unpark(self, token: Token, now: float) -> bool:
        """Make a parked token live again (a dead-letter replay); False if it changed."""
        entity = _entity(token.endpoint, token.attempt_id, TokenState.LIVE, token.message_id,
                         now)
        try:
            self._tables.replace(self._table, entity, etag=token.etag)
        except (PreconditionFailed, NotFound):
            return False
        return True

    def all(self) -> list[Token]:
        """Every token row (for the sweeper and the checks; not a hot path)."""
        return [_token(row) for row in self._tables.query(self._table)]

    def delete_if_unchanged(self, token: Token) -> None:
        with contextlib.suppress(PreconditionFailed):
            self._tables.delete(self._table, token.endpoint, token.attempt_id, etag=token.etag)


def _token(row: Entity) -> Token:
    props = row.properties
    since = props.get("since")
    return Token(row.partition_key, row.row_key, TokenState(str(props["state"])),
                 str(props.get("message_id", "")),
                 float(since) if isinstance(since, (int, float)) else 0.0, row.etag)


def _entity(endpoint: str, attempt_id: str, state: TokenState, message_id: str,
            now: float) -> Entity:
    return Entity(endpoint, attempt_id,
                  {"state": state.value, "message_id": message_id, "since": now})
