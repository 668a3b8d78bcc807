"""Group commit for concurrent sends from one process (``Settings.group_sends``).

A client that sends from several threads at once (a web app's request handlers, a
``send_many``, a producer pool) would make two requests per message: its token and its
signal. Instead, while one thread's requests are on the wire, the sends that arrive wait;
when it is done, the first of them takes everything waiting and puts it on its way together:
the tokens in one transaction per destination, the signals in one bundle per destination
(``bus.protocol.copies.bundles``). This is the group commit of databases and the batching of Kafka's
producer, without a timer: a lone sender never waits, and a waiting sender waits for at most
the flush ahead of it.

The group only shares requests. What a flush leaves undone is finished by each caller on its
own thread (``bus.protocol.send.sender``): if the token transaction failed, its outcome is
unknown, so the caller fences its attempt ids and sends alone with fresh ones; if a bundle
failed, the caller sends its signals again alone. One flush runs at a time per ``Bus``; each thread
flushes at most the one group it leads, so nobody does unbounded work for others.

Waiting uses a :class:`Gate` per caller (``threading.Event`` by default). The simulation
injects gates that yield to its scheduler instead of blocking the thread its greenlets share.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Protocol

from bus.envelope import Envelope
from bus.protocol.copies.bundles import MAX_PARTS
from bus.protocol.copies.courier import Courier
from bus.storage import StorageError

MAX_GROUP = MAX_PARTS
"""Copies per flush: one bundle's worth (more wait for the next flush)."""


class Gate(Protocol):
    """What a waiting caller blocks on; ``threading.Event`` is one."""

    def set(self) -> None: ...

    def wait(self, timeout: float | None = None) -> bool: ...


class Ticket:
    """One caller's copies in a group, and what became of them."""

    def __init__(self, envelopes: Sequence[Envelope], gate: Gate) -> None:
        self.envelopes = envelopes
        self.gate = gate
        self.lead = False
        """Set when this caller must flush the next group (the previous leader chose it)."""
        self.placed = False
        """The tokens exist. False after a flush: their outcome is unknown (fence, go alone)."""
        self.problems: list[StorageError | None] | None = None
        """Per copy, why its signal did not go (send it again), or None if it went. None for
        the whole list: the signals were never tried."""


class SendGroup:
    """Collects concurrent callers and flushes them together (module doc).

    ``flushes`` counts the flushes and ``grouped`` the copies that shared one with others
    (statistics for the benchmark and the simulation).
    """

    def __init__(self, courier: Courier, gate: Callable[[], Gate] = threading.Event) -> None:
        self._courier = courier
        self._gate = gate
        self._lock = threading.Lock()  # guards the fields below; never held across a request
        self._waiting: list[Ticket] = []
        self._busy = False
        self.flushes = 0
        self.grouped = 0

    def submit(self, envelopes: Sequence[Envelope]) -> Ticket:
        """Put ``envelopes`` on their way together with whatever else is waiting; returns once
        a flush has dealt with them (see ``Ticket`` for what it left undone)."""
        ticket = Ticket(envelopes, self._gate())
        with self._lock:
            self._waiting.append(ticket)
            leads = not self._busy
            self._busy = True
        if not leads:
            try:
                ticket.gate.wait()
            except BaseException:  # interrupted while waiting (Ctrl-C): leave the group
                self._leave(ticket)
                raise
            if not ticket.lead:
                return ticket  # another caller's flush took it
        self._lead()
        return ticket

    def _leave(self, ticket: Ticket) -> None:
        """Take a caller that stops waiting out of the line; if it had just been chosen to
        lead the next flush, choose the next one (else every later send would wait forever)."""
        with self._lock:
            if ticket not in self._waiting:
                return  # a flush has it already
            self._waiting.remove(ticket)
            if not ticket.lead:
                return
            successor = self._next_leader()
        if successor is not None:
            successor.gate.set()

    def _next_leader(self) -> Ticket | None:
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
            self._flush(group)
        finally:  # also when this caller dies half-way: never leave the others waiting
            with self._lock:
                successor = self._next_leader()
            if successor is not None:
                successor.gate.set()
            for ticket in group:
                ticket.gate.set()

    def _take(self) -> list[Ticket]:
        """The waiting tickets, oldest first, up to MAX_GROUP copies (at least one ticket)."""
        count = 0
        for taken, ticket in enumerate(self._waiting):
            if taken and count + len(ticket.envelopes) > MAX_GROUP:
                break
            count += len(ticket.envelopes)
        else:
            taken = len(self._waiting)
        group, self._waiting = self._waiting[:taken], self._waiting[taken:]
        return group

    def _flush(self, group: list[Ticket]) -> None:
        envelopes = [envelope for ticket in group for envelope in ticket.envelopes]
        self.flushes += 1
        if len(group) > 1:
            self.grouped += len(envelopes)
        try:
            if len(envelopes) == 1:
                self._courier.place(envelopes[0])  # one insert is cheaper than a transaction
            else:
                self._courier.place_many(envelopes)
        except StorageError:
            return  # outcome unknown: each caller fences its attempt ids and goes alone
        for ticket in group:
            ticket.placed = True
        problems = self._courier.signal_many(envelopes)
        for ticket in group:
            count = len(ticket.envelopes)
            ticket.problems, problems = problems[:count], problems[count:]
