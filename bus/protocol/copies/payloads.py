"""Claim checks: payloads too large for a queue message travel in a blob.

Each message copy gets its own blob, named ``<destination>/<attempt id>``. The sender writes it
after the copy's token exists and before the signal; the receiver deletes it once the outbox
slot that consumed the copy is cleared. The sweeper deletes a blob whose token is gone or fenced.
"""

from __future__ import annotations

import contextlib

from bus.envelope import Envelope, PayloadRef
from bus.errors import PayloadError
from bus.storage import Blobs, NotFound


class Payloads:
    def __init__(self, blobs: Blobs, container: str, max_bytes: int = 64 * 1024 * 1024) -> None:
        self.blobs = blobs
        self.container = container
        self.max_bytes = max_bytes
        """The largest claim-check payload sent or read (``Settings.max_payload_bytes``)."""

    def ref(self, destination: str, attempt_id: str) -> PayloadRef:
        return PayloadRef(container=self.container, blob=f"{destination}/{attempt_id}")

    def confined(self, envelope: Envelope, endpoint: str) -> bool:
        """Whether the envelope's payload reference (if any) names the one blob this copy's
        payload may be in: its own claim check at ``endpoint``. Anything else - another
        container, another message's blob, a topic file - is never read or deleted."""
        ref = envelope.payload_ref
        return ref is None or ref == self.ref(endpoint, envelope.attempt_id)

    def outside(self, envelope: Envelope, endpoint: str) -> str:
        """Why an envelope that is not ``confined`` cannot be processed (a poison reason)."""
        ref = envelope.payload_ref
        assert ref is not None
        expected = self.ref(endpoint, envelope.attempt_id)
        return (f"payload reference {ref.container[:63]}/{ref.blob[:200]} is not this "
                f"message's claim check ({expected.container}/{expected.blob}): not read")

    def put(self, ref: PayloadRef, data: bytes) -> None:
        self.check_size(len(data))
        self.blobs.write(ref.container, ref.blob, data)

    def check_size(self, size: int) -> None:
        """Raises PayloadError for a payload over ``max_bytes``: before anything is written, so
        that nothing is sent that its receiver would refuse."""
        if size > self.max_bytes:
            raise PayloadError(f"payload of {size} bytes is over the limit of {self.max_bytes} "
                               "(Settings.max_payload_bytes)")

    def of(self, envelope: Envelope) -> bytes | None:
        """The copy's payload bytes: inline, or its claim check's blob (``get``)."""
        if envelope.payload_ref is None:
            return envelope.inline_payload()
        return self.get(envelope.payload_ref)

    def get(self, ref: PayloadRef) -> bytes | None:
        """The payload, or None when its blob is gone. Raises PayloadError when the blob holds
        more than ``max_bytes`` (only that much and a byte is read)."""
        try:
            data = self.blobs.read(ref.container, ref.blob, max_bytes=self.max_bytes).data
        except NotFound:
            return None
        if len(data) > self.max_bytes:
            raise PayloadError(f"payload blob {ref.blob[:200]} holds more than "
                               f"{self.max_bytes} bytes (Settings.max_payload_bytes): not read")
        return data

    def delete(self, ref: PayloadRef) -> None:
        with contextlib.suppress(NotFound):
            self.blobs.delete(ref.container, ref.blob)

    def refs(self) -> list[PayloadRef]:
        """The claim checks in the container (not the poison entries kept there:
        ``bus.protocol.poison.queue``)."""
        return [PayloadRef(container=self.container, blob=name)
                for name in self.blobs.list(self.container) if not name.startswith("~")]
