"""Transport faults for any storage backend, for demos and end-to-end tests.

``DuplicatingQueues`` wraps a Queues port and sends some signals twice: the duplicate
deliveries at-least-once queues produce, injected on purpose so a run can show that they
are dropped.
"""

from __future__ import annotations

import random
import threading

from bus.storage import QueueMessage, Queues, Storage


class ForwardingQueues:
    """A Queues port that forwards every call to ``inner``: subclass it and override the calls
    you want to change (faults, counting, delays)."""

    def __init__(self, inner: Queues) -> None:
        self._inner = inner
        self.limits = inner.limits

    def create_queue(self, queue: str) -> None:
        self._inner.create_queue(queue)

    def send(self, queue: str, body: str, *, delay: float = 0.0) -> None:
        self._inner.send(queue, body, delay=delay)

    def receive(self, queue: str, *, max_messages: int, lease: float) -> list[QueueMessage]:
        return self._inner.receive(queue, max_messages=max_messages, lease=lease)

    def delete(self, queue: str, message: QueueMessage) -> None:
        self._inner.delete(queue, message)

    def extend(self, queue: str, message: QueueMessage, *, lease: float) -> QueueMessage:
        return self._inner.extend(queue, message, lease=lease)

    def peek(self, queue: str, *, max_messages: int) -> list[str]:
        return self._inner.peek(queue, max_messages=max_messages)

    def depth(self, queue: str) -> int:
        return self._inner.depth(queue)

    def oldest(self, queue: str) -> float | None:
        return self._inner.oldest(queue)


class DuplicatingQueues(ForwardingQueues):
    """Sends each message a second time with probability ``rate`` (seeded, thread-safe)."""

    def __init__(self, inner: Queues, rate: float, seed: int = 0) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"rate must be between 0 and 1, got {rate}")
        super().__init__(inner)
        self._rate = rate
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self.duplicated = 0

    def send(self, queue: str, body: str, *, delay: float = 0.0) -> None:
        self._inner.send(queue, body, delay=delay)
        with self._lock:
            twice = self._random.random() < self._rate
            self.duplicated += twice
        if twice:
            self._inner.send(queue, body, delay=delay)


def with_duplicates(storage: Storage, rate: float, seed: int = 0) -> tuple[Storage,
                                                                          DuplicatingQueues]:
    """``storage`` whose queue sends are duplicated at ``rate``, and the counting wrapper."""
    queues = DuplicatingQueues(storage.queues, rate, seed)
    return Storage(queues=queues, blobs=storage.blobs, tables=storage.tables), queues
