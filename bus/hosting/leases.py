"""Lease renewal: a handler that outlives its message's lease keeps the message to itself.

A leased queue message becomes visible again when its lease runs out, and another worker then
gets a second copy while the first is still being processed. That is safe (the claim's
compare-and-swap lets only one commit), but wasteful, and it burns delivery counts. The keeper
renews the leases of the messages a worker is processing at half their length, as the
Functions host does, up to a limit (a stuck handler must not hold a message forever).

Renewing changes a message's pop receipt: acknowledge and release through ``current`` so the
latest one is used (calls are serialised with the renewals on one lock).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from bus.storage import QueueMessage, Queues, StorageError

log = logging.getLogger(__name__)


class LeaseKeeper:
    def __init__(self, queues: Queues, queue: str, *, lease: float, limit: float) -> None:
        self._queues = queues
        self._queue = queue
        self._lease = lease
        self._limit = limit
        self._held: dict[str, QueueMessage] = {}
        self.lock = threading.Lock()
        self.renewals = 0

    @contextmanager
    def keeping(self, messages: Sequence[QueueMessage]) -> Iterator[None]:
        """Renew the leases of ``messages`` until the block ends (or the limit is reached)."""
        with self.lock:
            self._held = {m.id: m for m in messages}
        done = threading.Event()
        renewer = threading.Thread(target=self._renew, args=(done,), daemon=True,
                                   name=f"lease-keeper-{self._queue}")
        renewer.start()
        try:
            yield
        finally:
            done.set()
            renewer.join()
            with self.lock:
                self._held = {}

    def current(self, message: QueueMessage) -> QueueMessage:
        """The message with its latest pop receipt (call with ``lock`` held)."""
        return self._held.get(message.id, message)

    def forget(self, message: QueueMessage) -> None:
        """Stop renewing ``message`` (acknowledged or released; call with ``lock`` held)."""
        self._held.pop(message.id, None)

    def _renew(self, done: threading.Event) -> None:
        deadline = time.monotonic() + self._limit
        while not done.wait(self._lease / 2):
            if time.monotonic() >= deadline:
                log.warning("stopped renewing leases on %s after %.0f s (the limit): a "
                            "handler is stuck or too slow", self._queue, self._limit)
                return
            with self.lock:
                for message_id, message in list(self._held.items()):
                    try:
                        self._held[message_id] = self._queues.extend(
                            self._queue, message, lease=self._lease)
                        self.renewals += 1
                    except StorageError as exc:  # lost already: the copy is a duplicate now
                        log.info("renewing the lease of %s failed: %s", message_id, exc)
                        self._held.pop(message_id, None)
