"""Claim checks: payloads too large for a queue message travel in a blob.

Each message copy gets its own blob, named ``<destination>/<attempt id>``. The sender writes it
after the copy's token exists and before the signal; the receiver deletes it once the outbox
slot that consumed the copy is cleared. The sweeper deletes a blob whose token is gone or fenced.
"""

from __future__ import annotations

import contextlib

from bus.envelope import Envelope, PayloadRef
from bus.storage import Blobs, NotFound


class Payloads:
    def __init__(self, blobs: Blobs, container: str) -> None:
        self.blobs = blobs
        self.container = container

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
        self.blobs.write(ref.container, ref.blob, data)

    def get(self, ref: PayloadRef) -> bytes | None:
        try:
            return self.blobs.read(ref.container, ref.blob).data
        except NotFound:
            return None

    def delete(self, ref: PayloadRef) -> None:
        with contextlib.suppress(NotFound):
            self.blobs.delete(ref.container, ref.blob)

    def refs(self) -> list[PayloadRef]:
        """The claim checks in the container (not the poison entries kept there:
        ``bus.protocol.poison``)."""
        return [PayloadRef(container=self.container, blob=name)
                for name in self.blobs.list(self.container) if not name.startswith("~")]
