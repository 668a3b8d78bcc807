"""Signal bundles: several signals for one queue in one queue message.

A signal only tells its destination that a token may be processable; the token decides. So
the signals a worker sends to one queue at the same moment (a batch's outgoing messages, a
handler's several sends to one endpoint) can share a queue message: one queue operation
instead of one per signal on the sending side, and one lease and one delete on the receiving
side. Queue operations are the bus's most expensive kind (docs/performance.md), and sending
one is the most expensive request Azurite serves.

Receiving, a bundle is taken apart into its **parts**, each processed as the signal it carries
(poisoned, deferred, retried on its own). The queue message is deleted once every part is
settled; if any part is not (its handler failed, storage trouble), the message comes back
after its lease or its retry delay with all its parts, and those that were settled are
duplicates then (their tokens are gone), recognised in one token read.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from bus.envelope import BUNDLE_OVERHEAD, MAX_BUNDLE_PARTS, split_bundle


class Leased(Protocol):
    """A queue message as a host holds it: its body as on the queue, its dequeue count."""

    @property
    def body(self) -> str: ...

    @property
    def dequeue_count(self) -> int: ...


M = TypeVar("M", bound=Leased)

MAX_PARTS = MAX_BUNDLE_PARTS
"""Signals per bundle at most: what one receive call leases at most, so a bundle is never a
bigger piece of work than a batch."""


def pack(signals: Sequence[str], capacity: int) -> list[list[int]]:
    """Group the envelope JSON texts ``signals`` (all for one queue) into bundles of at most
    ``capacity`` bytes (``StorageLimits.signal_bytes``), in order; returns the indexes of
    each bundle's signals."""
    groups: list[list[int]] = []
    size = 0
    for index, signal in enumerate(signals):
        length = len(signal.encode("utf-8")) + 1
        if not groups or len(groups[-1]) >= MAX_PARTS or \
                size + length > capacity - BUNDLE_OVERHEAD:
            groups.append([])
            size = 0
        groups[-1].append(index)
        size += length
    return groups


@dataclass
class _Settling:
    """The parts of one leased queue message still to settle."""

    size: int
    settled: set[int] = field(default_factory=set)
    released: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass(frozen=True)
class Part(Generic[M]):
    """One signal of a leased queue message (the whole message, for a plain signal)."""

    message: M
    body: str
    """The signal's own body, as it would sit on the queue alone."""
    index: int
    _settling: _Settling

    @property
    def dequeue_count(self) -> int:
        return self.message.dequeue_count

    def settled(self) -> bool:
        """Record that this part's outcome is durable; True when it was the message's last
        part to settle (the message may be deleted now). Saying it twice changes nothing."""
        with self._settling.lock:
            settling = self._settling
            last = len(settling.settled) == settling.size - 1 and \
                self.index not in settling.settled
            settling.settled.add(self.index)
            return last and not settling.released

    def release(self) -> bool:
        """Record that the message is to come back (this part was not settled); True for the
        first such call of the message (the one that should make it visible again)."""
        with self._settling.lock:
            first = not self._settling.released
            self._settling.released = True
            return first


def parts(messages: Sequence[M]) -> list[Part[M]]:
    """The parts of leased ``messages``, in order."""
    found: list[Part[M]] = []
    for message in messages:
        bodies = split_bundle(message.body) or [message.body]
        settling = _Settling(len(bodies))
        found.extend(Part(message, body, index, settling) for index, body in enumerate(bodies))
    return found
