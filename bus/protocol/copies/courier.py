"""Putting one message copy on its way: token, claim-check payload, signal.

Shared by the dispatcher (messages from handlers) and the sender (messages from clients).
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Callable, Sequence

from bus.envelope import Envelope, encode_bundle, encode_signal, fits_signal
from bus.naming import Names
from bus.observability import Telemetry
from bus.protocol.copies.backpressure import Room
from bus.protocol.copies.bundles import pack
from bus.protocol.copies.payloads import Payloads
from bus.protocol.copies.sealing import Sealer
from bus.protocol.tokens.inbox import Inbox, Lineage, Origin
from bus.signing import payload_digest
from bus.storage import Queues, StorageError


class Courier:
    """``room`` refuses signals to full queues; ``in_flight`` bounds how many of this
    courier's calls are on the wire at once, across threads
    (``bus.protocol.copies.backpressure``)."""

    def __init__(self, *, queues: Queues, names: Names, inbox: Inbox, payloads: Payloads,
                 clock: Callable[[], float], room: Room | None = None,
                 in_flight: int = 32, bundles: bool = True,
                 token_before_payload: bool = True, sealer: Sealer | None = None,
                 telemetry: Telemetry | None = None) -> None:
        self._queues = queues
        self._telemetry = telemetry or Telemetry()
        self._names = names
        self.inbox = inbox
        self.payloads = payloads
        self._clock = clock
        self.room = room
        self.sealer = sealer or Sealer()
        """Signs a copy again when it gets a new attempt id (``Sender``, ``Dispatcher``)."""
        self._bundles = bundles
        self._token_first = token_before_payload  # off: the "payload-before-token" break
        self._capacity = queues.limits.signal_bytes
        self._longest_delay = queues.limits.longest_delay
        self.bundled = 0
        """Signals this courier sent in bundles of two or more (a statistic)."""
        self._in_flight = threading.BoundedSemaphore(in_flight)

    def place(self, envelope: Envelope) -> None:
        """Create the copy's inbox token, then (if it needs one) its payload blob.

        Token first: a payload blob then always has a token, or had one, which is what lets
        the sweeper delete a blob whose token is gone.
        """
        [checked] = self._claim_checks([envelope])
        with self._in_flight:
            if not self._token_first:
                self._put_payload(envelope, checked)
            self.inbox.create(envelope.destination, envelope.attempt_id, envelope.message_id,
                              self._clock(), due_at(envelope), lineage=Lineage.of(envelope))
            if self._token_first:
                self._put_payload(envelope, checked)

    def _claim_checks(self, envelopes: Sequence[Envelope]) -> list[bytes | None]:
        """Each copy's claim-check payload (None: it fits its signal), decided once; a
        PayloadError before anything is written when one is over the limit its receiver
        reads (``Payloads.max_bytes``)."""
        payloads = [None if fits_signal(e, self._capacity) else e.inline_payload()
                    for e in envelopes]
        for data in payloads:
            if data is not None:
                self.payloads.check_size(len(data))
        return payloads

    def check_payloads(self, envelopes: Sequence[Envelope]) -> None:
        """Raise PayloadError when a copy's claim-check payload is over the limit its
        receiver reads: before anything is written."""
        self._claim_checks(envelopes)

    def put_payloads(self, envelopes: Sequence[Envelope]) -> None:
        """The claim-check blobs of the copies that need one (their tokens exist already)."""
        for envelope in envelopes:
            if not fits_signal(envelope, self._capacity):
                self._put_payload(envelope, envelope.inline_payload())

    def _put_payload(self, envelope: Envelope, data: bytes | None) -> None:
        if data is not None:
            self.payloads.put(self.payloads.ref(envelope.destination, envelope.attempt_id),
                              data)

    def place_many(self, envelopes: Sequence[Envelope],
                   origins: Sequence[Origin] | None = None) -> list[str]:
        """``place`` for copies with fresh attempt ids: the tokens in one request per
        destination (pending, when each copy's ``origins`` is given), then the claim-check
        blobs; returns the tokens' ETags in copy order. Any error leaves the outcome unknown:
        these attempt ids must not be used again (see ``Inbox.create_many``)."""
        by_destination: dict[str, list[int]] = {}
        for index, envelope in enumerate(envelopes):
            by_destination.setdefault(envelope.destination, []).append(index)
        now = self._clock()
        etags = [""] * len(envelopes)
        checked = self._claim_checks(envelopes)
        with self._in_flight:
            if not self._token_first:
                for envelope, data in zip(envelopes, checked, strict=True):
                    self._put_payload(envelope, data)
            for destination, indexes in by_destination.items():
                created = self.inbox.create_many(
                    destination,
                    [(envelopes[i].attempt_id, envelopes[i].message_id) for i in indexes], now,
                    [origins[i] for i in indexes] if origins is not None else None,
                    [due_at(envelopes[i]) for i in indexes],
                    lineages=[Lineage.of(envelopes[i]) for i in indexes])
                for index, etag in zip(indexes, created, strict=True):
                    etags[index] = etag
            if self._token_first:
                for envelope, data in zip(envelopes, checked, strict=True):
                    self._put_payload(envelope, data)
        return etags

    def check_room(self, destination: str) -> None:
        """Raise QueueFull when ``destination``'s queue is at its maximum depth."""
        if self.room is not None:
            self.room.check(destination)

    def signal(self, envelope: Envelope, *, check_room: bool = True) -> None:
        """Put the copy's signal on its destination's queue (invisible until it is due, up to
        the queue's 7-day limit; the receiver defers a longer one again). Raises QueueFull
        when that queue is at its maximum depth (unless the caller checked already)."""
        if check_room:
            self.check_room(envelope.destination)
        with self._in_flight:
            self._queues.send(self._names.queue(envelope.destination),
                              encode_signal(self.signal_form(envelope)),
                              delay=due_in(envelope, self._clock(), self._longest_delay))
        self._telemetry.signalled(envelope.destination, 1)

    def signal_many(self, envelopes: Sequence[Envelope]) -> list[StorageError | None]:
        """``signal`` for several copies: those due now travel in bundles, one queue message
        per destination (or per ``bundles.MAX_PARTS`` or 64 KiB); scheduled copies alone.

        Returns, per copy, None (sent) or why not: QueueFull for a full destination, the
        error of a failed look at its depth, or the storage error of the send its bundle was
        in (its outcome unknown: sending again is harmless, tokens deduplicate)."""
        problems: list[StorageError | None] = [None] * len(envelopes)
        alone: list[int] = []
        by_destination: dict[str, list[int]] = {}
        now = self._clock()
        for index, envelope in enumerate(envelopes):
            if self._bundles and due_in(envelope, now, self._longest_delay) == 0:
                by_destination.setdefault(envelope.destination, []).append(index)
            else:
                alone.append(index)
        for destination, indexes in by_destination.items():
            texts = [self.signal_form(envelopes[i]).to_json() for i in indexes]
            try:
                self.check_room(destination)
            except StorageError as exc:  # full, or its depth unread: each caller finishes its own
                for index in indexes:
                    problems[index] = exc
                continue
            for group in pack(texts, self._capacity):
                try:
                    self._send_bundle(destination, [texts[g] for g in group])
                except StorageError as exc:
                    for g in group:
                        problems[indexes[g]] = exc
        for index in alone:
            try:
                self.signal(envelopes[index])
            except StorageError as exc:
                problems[index] = exc
        return problems

    def _send_bundle(self, destination: str, texts: list[str]) -> None:
        body = (encode_bundle(texts) if len(texts) > 1
                else base64.b64encode(texts[0].encode("utf-8")).decode("ascii"))
        with self._in_flight:
            self._queues.send(self._names.queue(destination), body)
        self._telemetry.signalled(destination, len(texts))
        if len(texts) > 1:
            self.bundled += len(texts)

    def fits(self, envelope: Envelope) -> bool:
        """Whether the envelope travels inline (else its payload goes to a blob)."""
        return fits_signal(envelope, self._capacity)

    def signal_form(self, envelope: Envelope) -> Envelope:
        if fits_signal(envelope, self._capacity):
            return envelope
        ref = self.payloads.ref(envelope.destination, envelope.attempt_id)
        update: dict[str, object] = {"payload": None, "payload_ref": ref,
                                     "payload_encoding": "utf-8"}
        if envelope.signature is not None:  # the signature covers the blob's digest
            update["payload_sha256"] = payload_digest(envelope.inline_payload())
        return envelope.model_copy(update=update)

    def resend(self, destination: str, body: str) -> None:
        """Send a signal body kept from earlier (a released deferral) as it was."""
        with self._in_flight:
            self._queues.send(self._names.queue(destination), body)
        self._telemetry.signalled(destination, 1)

    def now(self) -> float:
        return self._clock()

    def fence(self, destination: str, attempt_id: str, message_id: str) -> None:
        """Make sure a superseded attempt can never be processed, and drop its payload."""
        self.inbox.fence(destination, attempt_id, message_id, self._clock())
        self.payloads.delete(self.payloads.ref(destination, attempt_id))

    def fence_many(self, attempts: Sequence[tuple[str, str]], message_id: str) -> None:
        """``fence`` for the superseded attempts ``(destination, attempt id)`` of one message:
        the tombstones in one request per destination; their claim-check blobs are left to
        the sweeper, which deletes a blob whose token is fenced."""
        by_destination: dict[str, list[str]] = {}
        for destination, attempt_id in attempts:
            by_destination.setdefault(destination, []).append(attempt_id)
        now = self._clock()
        for destination, attempt_ids in by_destination.items():
            self.inbox.fence_many(destination, attempt_ids, message_id, now)


def due_in(envelope: Envelope, now: float, longest: float) -> float:
    """Seconds until a scheduled copy is due (0 when it is not scheduled or due already),
    capped at ``longest``, the longest delay its queue allows (``StorageLimits``)."""
    if envelope.not_before is None:
        return 0.0
    return max(0.0, min(envelope.not_before.timestamp() - now, longest))


def due_at(envelope: Envelope) -> float | None:
    """When a scheduled copy's signal becomes visible, kept on its token (``sweeper``)."""
    return envelope.not_before.timestamp() if envelope.not_before is not None else None
