"""Lease renewal: a handler that outlives its message's lease keeps the message to itself.

A leased queue message becomes visible again when its lease runs out, and another worker then
gets a second copy while the first is still being processed. That is safe (the claim's
compare-and-swap lets only one commit), but wasteful, and it burns delivery counts. The keeper
renews the leases of the messages a worker is processing at half their length, as the
Functions host does, up to a limit (a stuck handler must not hold a message forever).

Renewing changes a message's pop receipt: acknowledge and release inside ``settling`` so the
latest one is used (each message's calls are serialised with its renewals on a lock of its
own, so a round's acknowledgements can go side by side).
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
        self._locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()
        """Guards the two dicts; a message's own lock guards its pop receipt."""
        self.renewals = 0

    @contextmanager
    def keeping(self, messages: Sequence[QueueMessage]) -> Iterator[None]:
        """Renew the leases of ``messages`` until the block ends (or the limit is reached)."""
        with self._lock:
            self._held = {m.id: m for m in messages}
            self._locks = {m.id: threading.Lock() for m in messages}
        done = threading.Event()
        renewer = threading.Thread(target=self._renew, args=(done,), daemon=True,
                                   name=f"lease-keeper-{self._queue}")
        renewer.start()
        try:
            yield
        finally:
            done.set()
            renewer.join()
            with self._lock:
                self._held, self._locks = {}, {}

    @contextmanager
    def settling(self, message: QueueMessage) -> Iterator[QueueMessage]:
        """``message`` with its latest pop receipt, not renewed while the block runs (the
        acknowledgement or release), nor after it."""
        with self._lock:
            lock = self._locks.get(message.id)
        if lock is None:  # not (or no longer) kept
            yield message
            return
        with lock:
            with self._lock:
                current = self._held.get(message.id, message)
            yield current
            with self._lock:
                self._held.pop(message.id, None)

    def _renew(self, done: threading.Event) -> None:
        deadline = time.monotonic() + self._limit
        while not done.wait(self._lease / 2):
            if time.monotonic() >= deadline:
                log.warning("stopped renewing leases on %s after %.0f s (the limit): a "
                            "handler is stuck or too slow", self._queue, self._limit)
                return
            with self._lock:
                locks = dict(self._locks)
            for message_id, lock in locks.items():
                with lock:
                    self._renew_one(message_id)

    def _renew_one(self, message_id: str) -> None:
        """Renew one message's lease (its own lock held), unless it was settled meanwhile."""
        with self._lock:
            message = self._held.get(message_id)
        if message is None:
            return
        try:
            renewed = self._queues.extend(self._queue, message, lease=self._lease)
        except StorageError as exc:  # lost already: the copy is a duplicate now
            log.info("renewing the lease of %s failed: %s", message_id, exc)
            renewed = None
        with self._lock:
            if renewed is None:
                self._held.pop(message_id, None)
            else:
                self._held[message_id] = renewed
                self.renewals += 1
