"""Group commit: concurrent callers in one process share one round of requests.

While one caller's requests are on the wire, the callers that arrive wait; when it is done,
the first of them takes everything waiting and does the work of all of them at once (the
group commit of databases, the batching of Kafka's producer), without a timer: a lone caller
never waits, and a waiting caller waits for at most the flush ahead of it. One flush runs at a
time per group; each caller flushes at most the one group it leads, so nobody does unbounded
work for others.

The client's concurrent sends share their token transaction and signal bundle this way
(``bus.protocol.send.group``); under Azure Functions, concurrent invocations of one endpoint
share a claim round (``bus.hosting.functions.rounds``).

What a flush did for each member is written on the member itself by the flush; a member the
flush never reached (its leader died half-way) finds nothing written and must say so to its
own caller. Waiting uses a :class:`Gate` per caller (``threading.Event`` by default); the
simulation injects gates that yield to its scheduler instead of blocking the one thread its
actors share.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

T = TypeVar("T")


class Gate(Protocol):
    """What a waiting caller blocks on; ``threading.Event`` is one."""

    def set(self) -> None: ...

    def wait(self, timeout: float | None = None) -> bool: ...


@dataclass(eq=False)
class _Place(Generic[T]):
    """One caller in line: its member and the gate it waits on."""

    member: T
    gate: Gate
    lead: bool = False
    """Set when this caller must flush the next group (the previous leader chose it)."""


@dataclass(eq=False)
class GroupCommit(Generic[T]):
    """Collects concurrent callers' members and flushes them together (module doc).

    ``flush`` does the work of a group (at least one member, oldest first) and writes each
    member's outcome on it; ``limit`` bounds a group's total ``weight`` (a single member
    heavier than that still goes, alone). ``flushes`` counts the flushes and ``grouped`` the
    weight that shared one with others (statistics for the benchmark and the simulation).
    """

    flush: Callable[[list[T]], None]
    gate: Callable[[], Gate] = threading.Event
    limit: int = 32
    weight: Callable[[T], int] = field(default=lambda _: 1)
    flushes: int = 0
    grouped: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    """Guards the line and ``_busy``; never held across a request."""
    _waiting: list[_Place[T]] = field(default_factory=list, repr=False)
    _busy: bool = False

    @property
    def waiting(self) -> int:
        """Callers in line, the one being flushed for not among them."""
        return len(self._waiting)

    @property
    def busy(self) -> bool:
        """Whether a flush runs (or its successor is about to start one)."""
        return self._busy

    def submit(self, member: T) -> None:
        """Have ``member`` flushed together with whatever else is waiting; returns once a
        flush has dealt with it (or died trying: then nothing is written on it)."""
        place = _Place(member, self.gate())
        with self._lock:
            self._waiting.append(place)
            leads = not self._busy
            self._busy = True
        if not leads:
            try:
                place.gate.wait()
            except BaseException:  # interrupted while waiting (Ctrl-C): leave the line
                self._leave(place)
                raise
            if not place.lead:
                return  # another caller's flush took it
        self._lead()

    def _leave(self, place: _Place[T]) -> None:
        """Take a caller that stops waiting out of the line; if it had just been chosen to
        lead the next flush, choose the next one (else every later caller would wait
        forever)."""
        with self._lock:
            if place not in self._waiting:
                return  # a flush has it already
            self._waiting.remove(place)
            if not place.lead:
                return
            successor = self._next_leader()
        if successor is not None:
            successor.gate.set()

    def _next_leader(self) -> _Place[T] | None:
        """With the lock held: mark the caller that leads the next flush, or, when nobody
        waits, note that no flush runs."""
        successor = self._waiting[0] if self._waiting else None
        if successor is not None:
            successor.lead = True
        else:
            self._busy = False
        return successor

    def _lead(self) -> None:
        with self._lock:
            group = self._take()
        try:
            members = [place.member for place in group]
            self.flushes += 1
            if len(members) > 1:
                self.grouped += sum(self.weight(member) for member in members)
            self.flush(members)
        finally:  # also when this caller dies half-way: never leave the others waiting
            with self._lock:
                successor = self._next_leader()
            if successor is not None:
                successor.gate.set()
            for place in group:
                place.gate.set()

    def _take(self) -> list[_Place[T]]:
        """The waiting callers, oldest first, up to ``limit`` in weight (at least one)."""
        total = 0
        for taken, place in enumerate(self._waiting):
            weight = self.weight(place.member)
            if taken and total + weight > self.limit:
                break
            total += weight
        else:
            taken = len(self._waiting)
        group, self._waiting = self._waiting[:taken], self._waiting[taken:]
        return group
