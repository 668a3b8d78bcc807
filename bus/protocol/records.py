"""Persistent records of the protocol: what an outbox slot holds."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from bus.envelope import Envelope, PayloadRef


class Phase(str, enum.Enum):
    COMMITTED = "committed"  # state written; tokens of the current attempt ids may not exist
    SENDING = "sending"  # every token (and payload blob) of the current attempt ids exists
    # (committed in this phase when the tokens were created, pending, before the commit)
    DONE = "done"  # ledger records only (``ledger``): every signal sent, superseded fenced


class Attempt(BaseModel):
    """One attempt id issued to one destination; superseded attempts get fenced."""

    model_config = ConfigDict(frozen=True)
    destination: str
    attempt_id: str


class Release(BaseModel):
    """A deferred message a handler asked to release (``Context.release_deferred``)."""

    model_config = ConfigDict(frozen=True)
    endpoint: str
    message_id: str
    generation: int | None = None
    """The generation of the message's token when the handler ran (0 when there was no
    token to see yet): the deferral the request is for. A deferral of a later generation
    (released and deferred again since) is not this request's to release. None in records
    written before requests named their deferral."""


@dataclass(frozen=True)
class RecordKey:
    """Which committed record a step started elsewhere acts on (the Durable orchestration's):
    its partition and the incoming copy it was committed for. A message id alone does not name
    a record: it can come back to the same slot (a client sending an explicit id again, a
    released deferral processed again), each time with a new record."""

    partition: str
    message_id: str
    attempt_id: str | None
    """None only in jobs started before records were named this way: message id alone."""
    generation: int = 0

    def names(self, record: OutboxRecord) -> bool:
        if self.attempt_id is None:
            return record.message_id == self.message_id
        return ((record.message_id, record.attempt_id, record.generation)
                == (self.message_id, self.attempt_id, self.generation))


class OutboxRecord(BaseModel):
    """The incoming message a partition committed, and the messages it must send.

    It lives in the partition's outbox slot from the commit (atomic with the business state)
    until the partition's next commit replaces it; it is finished once the incoming token is
    consumed.
    """

    model_config = ConfigDict(frozen=True)

    v: Literal[1] = 1
    """The record's version (``bus.versions.OUTBOX_RECORD``)."""
    endpoint: str
    message_id: str
    attempt_id: str
    message_type: str | None = None
    """The incoming message's type, for the operators' tools (a conversation's processed
    messages); absent in records written before it was kept, ignored by readers before it."""
    payload_ref: PayloadRef | None = None
    phase: Phase = Phase.COMMITTED
    outgoing: tuple[Envelope, ...] = ()
    superseded: tuple[Attempt, ...] = ()
    committed_at: float = 0.0
    """When the handler's commit happened (epoch seconds): maintenance finishes records that
    stay in a slot much longer than a dispatch takes."""
    deferred_signal: str | None = None
    """Set when the handler deferred the incoming message: its signal body, kept on its token
    for the release. Finishing the record then sets the token aside instead of consuming it."""
    generation: int = 0
    """The incoming token's generation (releases so far) when the handler ran."""
    releases: tuple[Release, ...] = ()
    """Deferred messages to release once the record is finished (releases are idempotent)."""
    pending: tuple[str, ...] = ()
    """ETags of the outgoing tokens, one per copy, when they were created pending before the
    commit (``dispatch``): finishing the record confirms them (pending -> live)."""
    sequences: dict[str, int] = Field(default_factory=dict)
    """The partition's sequence counters, ``<destination>/<session>`` -> the last number its
    handlers gave a copy to that session (``bus.protocol.sessions.order``). Every commit carries
    them on to the next record, so numbering costs no write of its own."""

    def is_for(self, envelope: Envelope) -> bool:
        return (self.message_id, self.attempt_id) == (envelope.message_id, envelope.attempt_id)

    def with_fresh_attempts(self, new_id: Callable[[], str],
                            resign: Callable[[Envelope], Envelope] = lambda e: e,
                            ) -> OutboxRecord:
        """Issue new attempt ids for every outgoing copy, each signed again by ``resign``
        (the signature covers the attempt id); remember the old ones for fencing - only
        those: the ones earlier passes superseded must be fenced already (``Dispatcher``), so
        that however many passes there are, the record grows by one pass's worth at most."""
        fresh = tuple(resign(e.model_copy(update={"attempt_id": new_id()}))
                      for e in self.outgoing)
        return self.model_copy(update={"outgoing": fresh, "superseded": self.attempts()})

    def attempts(self) -> tuple[Attempt, ...]:
        """The attempt ids of the outgoing copies, as ``superseded`` would list them."""
        return tuple(Attempt(destination=e.destination, attempt_id=e.attempt_id)
                     for e in self.outgoing)

    def sending(self) -> OutboxRecord:
        return self.model_copy(update={"phase": Phase.SENDING})

    def placed(self, etags: tuple[str, ...]) -> OutboxRecord:
        """This record with its outgoing tokens created pending (ETags in copy order)."""
        assert len(etags) == len(self.outgoing)
        return self.model_copy(update={"phase": Phase.SENDING, "pending": etags})

    def done(self) -> OutboxRecord:
        return self.model_copy(update={"phase": Phase.DONE})
