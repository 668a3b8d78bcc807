"""Claim checks: payloads too large for a queue message travel in a blob.

Each message copy gets its own blob, named ``<destination>/<attempt id>``. The sender writes it
after the copy's token exists and before the signal; the receiver deletes it once the outbox
slot that consumed the copy is cleared. The sweeper deletes a blob whose token is gone or fenced.
"""

from __future__ import annotations

import contextlib

from bus.envelope import PayloadRef
from bus.storage import Blobs, NotFound


class Payloads:
    def __init__(self, blobs: Blobs, container: str) -> None:
        self.blobs = blobs
        self.container = container

    def ref(self, destination: str, attempt_id: str) -> PayloadRef:
        return PayloadRef(container=self.container, blob=f"{destination}/{attempt_id}")

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
