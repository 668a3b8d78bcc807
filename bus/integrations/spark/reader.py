"""Reading an endpoint's queue: take each pending message once, stage it, then settle it.

A Spark reader is an endpoint without handlers: its queue is ``names.queue(endpoint)`` and a
message copy may be taken only while its inbox token is live (docs/protocol.md). Taking a batch:

1. receive up to 32 queue messages and take bundles apart into their signals
   (``bus.protocol.copies.bundles``); admit each through the receiver's own admission
   (``bus.protocol.receive.admission``, with this reader's routing): a signature that does not
   hold - poison queue, token untouched; garbage, a wrong destination, a payload that is not the
   expected contract, a claim check outside the bus's container - poison queue with the
   reason, token poisoned; a time-to-live that ended - poisoned as expired; a scheduled copy
   that arrived early - back on the queue until due. What an endpoint would poison, a
   Spark read poisons;
2. read the admitted copies' tokens in one request: gone or fenced - a duplicate, delete it;
   poisoned - already in the poison queue; live - take it;
3. stage the taken messages under the batch's key (row key: the attempt id, so a copy staged
   twice is one row);
4. settle them: consume the token, delete the claim-check blob and the queue message (a
   bundle's once all its signals are settled; signals beyond the batch's limit are left to the
   next batch, and their message is made visible again at once).

Staging comes before settling, so a crash in between loses nothing: the batch's rows are there
and settling them again is harmless (``stage`` does it when it finds a batch that was never
closed). A closed batch (its ``~done`` marker row written) is only ever read again.

A batch read (``batch``) stops after step 3 (``settle=False``): its tokens stay live and its
queue messages leased until the read is committed, and each staged row keeps what settling
needs later - the queue message's id and pop receipt (``receipt``), and whether the message
holds nothing else (``whole``: no signal of it was left for a later batch).
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import logging
import math
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bus.bus import Bus
from bus.envelope import BadSignal, Envelope, PayloadRef
from bus.errors import ConfigurationError, PayloadError
from bus.integrations.spark.columns import Selection, row_of
from bus.integrations.spark.staging import MARKER, StagedRow, Staging, each, retried
from bus.messages import Message, received_as
from bus.protocol.copies.bundles import Part, parts
from bus.protocol.delivery import Incoming, Outcome
from bus.protocol.receive.admission import misaddressed, unreadable
from bus.protocol.tokens.verdict import Verdict, verdict
from bus.serialization import Serializer
from bus.storage import EntityValue, NotFound, QueueMessage

log = logging.getLogger("bus.spark")

@dataclass(frozen=True)
class _Taken:
    part: Part[QueueMessage]
    envelope: Envelope
    payload: str
    binary: bool
    """``payload`` is the base64 of binary bytes."""


@dataclass(frozen=True)
class _Opened:
    """An admitted copy as a reader keeps it: its payload as text (base64 for binary
    bytes)."""

    envelope: Envelope
    payload: str
    binary: bool


class ReaderRouting:
    """What a Spark reader of ``endpoint`` takes: copies addressed to it and, with a
    ``contract``, of that message type, in the serializer's content type, valid against it
    (the payload is kept as it came; binary bytes as base64)."""

    def __init__(self, endpoint: str, contract: type[Message] | None,
                 serializer: Serializer) -> None:
        self._endpoint = endpoint
        self._contract = contract
        self._serializer = serializer

    def refusal(self, envelope: Envelope) -> str | None:
        problem = misaddressed(envelope, self._endpoint)
        contract = self._contract
        if problem is not None or contract is None:
            return problem
        if envelope.message_type not in (contract.message_type, *contract.aliases):
            return (f"message type {envelope.message_type!r} arrived at {self._endpoint!r}, "
                    f"whose reader expects {contract.message_type!r}")
        return unreadable(envelope, self._serializer)

    def decode(self, envelope: Envelope, payload: bytes) -> _Opened:
        if self._contract is not None:
            try:
                with received_as(self._contract, envelope.message_type):
                    self._serializer.loads(payload, self._contract)
            except PayloadError as exc:
                raise BadSignal(str(exc)) from exc
        binary = (envelope.payload_encoding == "base64" if envelope.encryption is None
                  else not self._serializer.text)  # a ciphertext is base64 whatever it hid
        if binary:  # kept base64-encoded
            return _Opened(envelope, base64.b64encode(payload).decode("ascii"), True)
        return _Opened(envelope, payload.decode("utf-8"), False)


class Drainer:
    """Takes messages from ``endpoint``'s queue into staged batches (see the module doc)."""

    def __init__(self, bus: Bus, staging: Staging, endpoint: str, *,
                 contract: type[Message] | None = None, lease_seconds: float = 300.0,
                 parallelism: int = 16) -> None:
        self._bus = bus
        self._parts = bus.parts
        self._staging = staging
        self.endpoint = endpoint
        self._queue = bus.names.queue(endpoint)
        self._lease = lease_seconds
        self._parallelism = parallelism
        self._admission = bus.parts.admission(
            endpoint, ReaderRouting(endpoint, contract, bus.parts.serializer))
        self.received = 0
        """Queue messages received so far (each time it is received)."""
        self.consumed = 0
        """Queue messages deleted so far, every part of each settled (a bundle a batch's end
        split comes back, and counts once it is deleted)."""
        self._signals = 0  # signals in the queue messages received so far
        self._counting = threading.Lock()  # settling deletes on several threads

    @property
    def bus(self) -> Bus:
        return self._bus

    @property
    def queue(self) -> str:
        return self._queue

    @property
    def rows_per_message(self) -> float:
        """Signals a received queue message has held on average (a bundle holds up to 32;
        1 before anything was received): how many rows a queue's depth in messages holds."""
        return self._signals / self.received if self.received else 1.0

    def prepare(self, topics: Sequence[str] = ()) -> None:
        """Create what reading needs (idempotent): the bus's tables and containers, the
        endpoint's queue and poison queue, the staging table; subscribe to ``topics``."""
        subscribe(self._bus, self.endpoint, topics)
        self._staging.ensure()

    def stage(self, key: str, limit: int, *, close_empty: bool, fresh: bool = False,
              settle: bool = True, seen: set[str] | None = None,
              most: int | None = None) -> int | None:
        """Take up to ``limit`` messages into the batch ``key`` and close it; returns how many
        it holds. A closed batch is returned as it is. With nothing to take and
        ``close_empty`` false, nothing is written and None is returned. ``fresh``: the caller
        knows the batch was never started (skips one read). ``settle`` false: the messages
        are staged only (a batch read: ``batch``), for ``settle_rows`` to settle later; their
        tokens stay live, so ``seen`` (the attempt ids the read took so far, in its other
        batches; updated) keeps another copy of one from being taken again. ``most``: take
        every part of the queue messages received, past ``limit`` up to ``most`` - an
        unsettled read must, as a bundle's parts left behind would stay leased with the ones
        taken (only a settled batch can put a bundle back for its other parts)."""
        rows = [] if fresh else self._staging.rows(key)
        seen = set() if seen is None else seen
        seen.update(row_key for row_key, _ in rows if row_key != MARKER)
        if rows and rows[-1][0] == MARKER:
            return len(rows) - 1
        if rows and settle:  # a batch that was never closed: settle what it holds, carry on
            log.warning("batch %s was left open by a crash: settling its %d messages",
                        key, len(rows))
            self._resettle([values for _, values in rows])
        count = len(rows)
        while count < limit:
            started = time.time_ns()
            wanted = max(1, math.ceil((limit - count) / self.rows_per_message))
            received = self._staging.retried(self._parts.storage.queues.receive, self._queue,
                               max_messages=min(32, wanted), lease=self._lease)
            if not received:
                break
            signals = parts(received)
            self.received += len(received)
            self._signals += len(signals)
            taken, extra = self._sort(signals, seen)
            # Linked to each taken message's creation: a trace reaches the Spark read.
            self._parts.telemetry.received(self.endpoint, len(received), started,
                                         [t.envelope for t in taken])
            cut = (limit if most is None else max(limit, most)) - count
            taken, later = taken[:cut], taken[cut:]
            early = settle and not self._parts.safeguards.stage_before_settle  # a break
            if early:
                self._settle(taken, extra)
            kept = {t.part.message.id for t in later}
            self._staging.put(key, [self._row(t, count + i, whole=t.part.message.id not in kept)
                                    for i, t in enumerate(taken)])
            if settle and not early:
                self._settle(taken, extra)
            # Unsettled (a batch read), another copy of a signal taken already stays: the one
            # staged may be that very queue message again, whose receipt is the row's.
            self._release(later)
            count += len(taken)
        if count == 0 and not close_empty:
            return None
        self._staging.upsert(key, StagedRow(MARKER, {"rows": count,
                                                     "closed_at": self._parts.clock()}))
        return count

    # -- sorting a received round ---------------------------------------------------------------
    def _sort(self, received: list[Part[QueueMessage]],
              seen: set[str]) -> tuple[list[_Taken], list[Part[QueueMessage]]]:
        """The received signals (a bundle's taken apart: ``bus.protocol.copies.bundles``) that can
        be taken, and the copies of ones taken already; settles the rest."""
        admitted: list[tuple[Part[QueueMessage], _Opened]] = []
        extra: list[Part[QueueMessage]] = []
        for part in received:
            item = Incoming(part.body, part.dequeue_count, ack=functools.partial(self._delete,
                                                                                 part))
            # Retried whole on a transient error: a poisoning run twice finds the token it
            # poisoned and drops the copy; a copy put back twice is one message to its token.
            envelope = self._staging.retried(self._admission.authenticate, item,
                                             self._admission.decode(item))
            if isinstance(envelope, Outcome):
                continue  # poisoned, and settled
            if envelope.attempt_id in seen:
                # Taken by this read already, its token live until the read commits: not
                # screened again (an expired copy of it must not poison that token).
                extra.append(part)
                continue
            opened = self._staging.retried(self._admission.screen, item, envelope)
            if not isinstance(opened, Outcome):  # else poisoned, put back or dropped: settled
                admitted.append((part, opened))
        tokens = self._staging.retried(self._parts.inbox.read_many, self.endpoint,
                         [opened.envelope.attempt_id for _, opened in admitted])
        taken: list[_Taken] = []
        for part, opened in admitted:
            envelope = opened.envelope
            found = verdict(tokens.get(envelope.attempt_id))
            if envelope.attempt_id in seen:
                extra.append(part)  # another copy of a signal taken already
            elif found.payload_is_garbage:
                self._duplicate(part, envelope)  # consumed or fenced
            elif found is not Verdict.PROCESS:
                self._delete(part)  # in the poison queue, or set aside by a handler
            else:
                seen.add(envelope.attempt_id)
                taken.append(_Taken(part, envelope, opened.payload, opened.binary))
        return taken, extra

    def _row(self, taken: _Taken, seq: int, *, whole: bool) -> StagedRow:
        e = taken.envelope
        message = taken.part.message
        values: dict[str, EntityValue] = {
            "seq": seq, "message_id": e.message_id, "message_type": e.message_type,
            "correlation_id": e.correlation_id, "causation_id": e.causation_id,
            "source": e.source, "topic": e.topic, "sent_at": e.sent_at.isoformat(),
            "headers": json.dumps(e.headers), "attempt_id": e.attempt_id,
            "queue_message": message.id, "receipt": message.pop_receipt, "whole": whole,
            "binary": taken.binary or None}
        if e.payload_ref is not None:
            values["payload_container"] = e.payload_ref.container
            values["payload_blob"] = e.payload_ref.blob
        return StagedRow(e.attempt_id, {k: v for k, v in values.items() if v is not None},
                         {"payload": taken.payload})

    # -- settling -------------------------------------------------------------------------------
    def _settle(self, taken: list[_Taken], extra: list[Part[QueueMessage]]) -> None:
        def settle(t: _Taken) -> None:
            # Consuming the token is what makes the take final; it must not be skipped.
            self._staging.retried(self._parts.inbox.consume, self.endpoint, t.envelope.attempt_id)
            self._delete(t.part)
            if t.envelope.payload_ref is not None:
                self._staging.retried(self._parts.payloads.delete, t.envelope.payload_ref)

        each(self._parallelism, settle, taken)
        each(self._parallelism, self._delete, extra)

    def _resettle(self, rows: Sequence[Mapping[str, EntityValue]]) -> None:
        def settle(values: Mapping[str, EntityValue]) -> None:
            self._staging.retried(self._parts.inbox.consume, self.endpoint,
                                  str(values["attempt_id"]))
            if "payload_blob" in values:
                self._staging.retried(self._parts.payloads.delete, PayloadRef(
                    container=str(values["payload_container"]),
                    blob=str(values["payload_blob"])))

        each(self._parallelism, settle, rows)

    def settle_rows(self, rows: Sequence[Mapping[str, EntityValue]]) -> None:
        """Settle staged rows of a batch read (``stage(settle=False)``): consume their tokens,
        delete their claim-check blobs, then the queue messages they wholly hold (a message
        whose lease ran out is not found: it comes back and is dropped as a duplicate)."""
        attempts = [str(values["attempt_id"]) for values in rows]
        if attempts:  # 100 a request (a token gone already is fine)
            self._staging.retried(self._parts.inbox.consume_many, self.endpoint, attempts)
        each(self._parallelism, lambda ref: self._staging.retried(self._parts.payloads.delete, ref),
             [PayloadRef(container=str(values["payload_container"]),
                         blob=str(values["payload_blob"]))
              for values in rows if "payload_blob" in values])
        each(self._parallelism, self._delete_staged, _whole_messages(rows))

    def release_rows(self, rows: Sequence[Mapping[str, EntityValue]]) -> None:
        """Make the queue messages of staged rows visible again at once (a batch read given
        up: its tokens are live, the next read takes them)."""
        def release(message: QueueMessage) -> None:
            with contextlib.suppress(NotFound):  # its lease ran out: visible already
                self._staging.retried(self._parts.storage.queues.extend, self._queue, message,
                                      lease=0)

        each(self._parallelism, release, _messages(rows))

    def _delete_staged(self, message: QueueMessage) -> None:
        with contextlib.suppress(NotFound):
            self._staging.retried(self._parts.storage.queues.delete, self._queue, message)

    def _delete(self, part: Part[QueueMessage]) -> None:
        """The part is settled; its queue message goes once all of its parts are."""
        if not part.settled():
            return
        # NotFound: the lease ran out; the copy comes back and is recognised as a duplicate.
        with contextlib.suppress(NotFound):
            self._staging.retried(self._parts.storage.queues.delete, self._queue, part.message)
            with self._counting:
                self.consumed += 1

    def _release(self, later: list[_Taken]) -> None:
        """Parts left for the next batch (the limit was reached within a bundle): their
        message comes back at once, its settled parts then duplicates."""
        messages = {t.part.message.id: t.part for t in later if t.part.release()}
        for part in messages.values():
            with contextlib.suppress(NotFound):
                self._staging.retried(self._parts.storage.queues.extend, self._queue,
                                      part.message, lease=0)

    def _duplicate(self, part: Part[QueueMessage], envelope: Envelope) -> None:
        # The token is gone: the copy's own claim-check blob is garbage (and only that one).
        if envelope.payload_ref is not None and self._parts.payloads.confined(envelope,
                                                                            self.endpoint):
            self._staging.retried(self._parts.payloads.delete, envelope.payload_ref)
        self._delete(part)


def _messages(rows: Sequence[Mapping[str, EntityValue]], *,
              whole: bool = False) -> list[QueueMessage]:
    """The queue messages staged rows came from (each once), as their receipt names them."""
    found: dict[str, QueueMessage] = {}
    for values in rows:
        if "receipt" in values and (values.get("whole") or not whole):
            found.setdefault(str(values["queue_message"]), QueueMessage(
                str(values["queue_message"]), str(values["receipt"]), "", 0))
    return list(found.values())


def _whole_messages(rows: Sequence[Mapping[str, EntityValue]]) -> list[QueueMessage]:
    return _messages(rows, whole=True)


def subscribe(bus: Bus, endpoint: str, topics: Sequence[str] = ()) -> None:
    """Make ``endpoint`` a reader endpoint: the bus's shared tables and containers, its queue
    and poison queue, and its subscription to each of ``topics`` (idempotent)."""
    bus.provision()
    queues = bus.storage.queues
    retried(queues.create_queue, bus.names.queue(endpoint))
    retried(queues.create_queue, bus.names.poison_queue(endpoint))
    for topic in topics:
        try:
            bus.parts.topics.subscribe(topic, endpoint)  # reads first: writes only when missing
        except Exception as exc:
            if getattr(exc, "status_code", None) != 403:
                raise
            raise ConfigurationError(
                f"{endpoint!r} is not subscribed to {topic!r}, and this identity may not write "
                "topic files: declare the reader in the app (BusFunctions(..., readers="
                f"{{{endpoint!r}: [{topic!r}]}})), run `python -m bus topology export` and "
                "deploy - the deployment writes the subscription") from exc


def staged_rows(staging: Staging, key: str, contract: type[Message] | None,
                selection: Selection | None = None) -> list[tuple[Any, ...]]:
    """The rows of a staged batch, in the order they were taken, as tuples in the column
    order of ``schema_ddl(contract)`` (or of ``selection``: ``columns.select``)."""
    rows = [values for row_key, values in staging.rows(key) if row_key != MARKER]
    rows.sort(key=lambda values: int(str(values.get("seq") or 0)))
    return [row_of(values, contract, selection) for values in rows]
