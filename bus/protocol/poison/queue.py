"""The poison queue: where a signal goes when the endpoint cannot or will not process it.

Each entry is a JSON document (base64-encoded, like every signal) with the reason, the exception
text, the delivery count, the endpoint and the original body exactly as it was on the queue, so
nothing is lost and a person can see why.

An entry is about three times the size of its signal (the body is base64 inside base64, beside
the decoded envelope), so one for a large signal does not fit a queue message. Such an entry is
written whole to a blob of the payload container (``~poison/<endpoint>/<id>``: the ``~`` keeps
it apart from claim checks, which the sweeper collects), and the queue gets a version 2 entry
that points to it with ``entry_ref`` and carries the reason. Readers fetch the whole entry
(``PoisonQueue.read``); replaying or purging the entry deletes the blob (``discard``).
Version 1 entries are written as before, so a reader one release older reads them all; it
cannot read a version 2 entry, and no release before this one could write that entry at all.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import json
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Literal

from pydantic import BaseModel, ConfigDict

from bus.envelope import BadSignal, Envelope, PayloadRef, carried_deliveries, decode_signal
from bus.ids import random_id
from bus.storage import Blobs, NotFound, Queues
from bus.versions import POISON_ENTRY

BLOB_PREFIX = "~poison/"
"""Where entries too large for a queue message are kept, in the payload container."""
_SHOWN = 2_000
"""Characters of the reason and exception a pointing entry repeats (the blob has them all)."""


def signal_digest(body: str) -> str | None:
    """What a poisoned token records of the copy whose poisoning poisoned it (``body``, as on
    the queue): the SHA-256 of its envelope as the bus reads it, without the delivery count
    a copy put back carries - any encoding of the same envelope has the same digest - so a
    replay can tell that copy from another entry's with the same ids. None for a body that
    is not a signal."""
    try:
        envelope = decode_signal(as_sent(body))
    except BadSignal:
        return None
    return hashlib.sha256(envelope.model_dump_json().encode("utf-8")).hexdigest()


def as_sent(body: str) -> str:
    """A signal body without the delivery count a copy put back carries (docs/envelope.md);
    anything else unchanged."""
    try:
        raw = base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        return body
    stripped, carried = carried_deliveries(raw)
    return base64.b64encode(stripped).decode("ascii") if carried else body


class PoisonEntry(BaseModel):
    model_config = ConfigDict(frozen=True)

    v: Literal[1, 2] = 1
    """The entry's version (``bus.versions.POISON_ENTRY``): 2 only for one that points to
    the whole entry in a blob (``entry_ref``)."""
    reason: str
    exception: str | None = None
    dequeue_count: int
    endpoint: str
    poisoned_at: datetime
    original_body: str
    envelope: Envelope | None = None
    entry_ref: PayloadRef | None = None
    """The blob holding the whole entry (version 2), or that held it (an entry read back)."""

    def encode(self) -> str:
        return base64.b64encode(self.model_dump_json(exclude_none=True).encode()).decode()

    @classmethod
    def decode(cls, body: str) -> PoisonEntry:
        """The entry ``body`` holds; ValueError (UnreadableVersion among them) for anything
        else, whatever the bytes."""
        try:
            document = json.loads(base64.b64decode(body))
        except RecursionError as exc:
            raise ValueError("a poison entry nested too deeply") from exc
        if not isinstance(document, dict):
            raise ValueError("a poison entry is a JSON object")
        return cls.model_validate(POISON_ENTRY.read(document))


class PoisonQueue:
    """Writes, reads and discards the entries of one endpoint's poison queue."""

    def __init__(self, queues: Queues, queue: str, endpoint: str, *, blobs: Blobs,
                 container: str, new_id: Callable[[], str] = random_id) -> None:
        self._queues = queues
        self._queue = queue
        self._endpoint = endpoint
        self._blobs = blobs
        self._container = container
        self._new_id = new_id

    def put(self, original_body: str, *, reason: str, dequeue_count: int, now: float,
            envelope: Envelope | None = None, exception: str | None = None) -> None:
        entry = PoisonEntry(
            reason=reason, exception=exception, dequeue_count=dequeue_count,
            endpoint=self._endpoint, original_body=original_body, envelope=envelope,
            poisoned_at=datetime.fromtimestamp(now, tz=timezone.utc))
        body = entry.encode()
        if len(body) > self._queues.limits.queue_message_chars:
            body = self._stored(entry, body).encode()
        self._queues.send(self._queue, body)

    def read(self, body: str) -> PoisonEntry:
        """The whole entry a poison-queue body holds or points to; raises what
        ``PoisonEntry.decode`` raises. A pointed-to blob that is gone leaves the pointing
        entry, with the reason saying so."""
        entry = PoisonEntry.decode(body)
        ref = entry.entry_ref
        if ref is None:
            return entry
        if not self._ours(ref):  # a forged pointer: never read (or delete) what it names
            return entry.model_copy(update={
                "reason": f"{entry.reason} (it points to {ref.container}/{ref.blob}, where "
                          "this bus keeps no poison entries: not read)", "entry_ref": None})
        try:
            data = self._blobs.read(ref.container, ref.blob).data
        except NotFound:
            return entry.model_copy(update={
                "reason": f"{entry.reason} (the whole entry, in blob {ref.blob}, is gone)"})
        return PoisonEntry.decode(data.decode("ascii")).model_copy(update={"entry_ref": ref})

    def gone(self, entry: PoisonEntry) -> bool:
        """Whether ``entry`` points to a whole entry of this queue's whose blob is gone: the
        entry it pointed to was replayed or purged through a twin (the pointer sent twice),
        and nothing is left to replay. A pointer elsewhere is not this queue's to judge."""
        ref = entry.entry_ref
        if ref is None or not self._ours(ref):
            return False
        try:
            self._blobs.read(ref.container, ref.blob, max_bytes=0)
        except NotFound:
            return True
        return False

    def discard(self, entry: PoisonEntry) -> None:
        """Delete the blob an entry was kept in, if any (after its queue entry is gone)."""
        if entry.entry_ref is not None and self._ours(entry.entry_ref):
            with contextlib.suppress(NotFound):
                self._blobs.delete(entry.entry_ref.container, entry.entry_ref.blob)

    def _ours(self, ref: PayloadRef) -> bool:
        """Whether ``ref`` names a blob where this queue keeps its entries."""
        return (ref.container == self._container
                and ref.blob.startswith(f"{BLOB_PREFIX}{self._endpoint}/")
                and "/" not in ref.blob[len(BLOB_PREFIX) + len(self._endpoint) + 1:])

    def _stored(self, entry: PoisonEntry, body: str) -> PoisonEntry:
        """Keep ``entry`` (encoded: ``body``) in a blob; the entry that points to it."""
        ref = PayloadRef(container=self._container,
                         blob=f"{BLOB_PREFIX}{self._endpoint}/{self._new_id()}")
        self._blobs.write(ref.container, ref.blob, body.encode("ascii"))
        return PoisonEntry(
            v=2, reason=entry.reason[:_SHOWN], dequeue_count=entry.dequeue_count,
            exception=entry.exception[:_SHOWN] if entry.exception is not None else None,
            endpoint=entry.endpoint, poisoned_at=entry.poisoned_at, original_body="",
            entry_ref=ref)
