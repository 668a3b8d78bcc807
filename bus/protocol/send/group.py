"""Group commit for concurrent sends from one process (``Settings.group_sends``).

A client that sends from several threads at once (a web app's request handlers, a
``send_many``, a producer pool) would make two requests per message: its token and its
signal. Instead the sends share flushes (``bus.groups``): while one thread's requests are on
the wire, the sends that arrive wait; the first of them then takes everything waiting and puts
it on its way together: the tokens in one transaction per destination, the signals in one
bundle per destination (``bus.protocol.copies.bundles``).

The group only shares requests. What a flush leaves undone is finished by each caller on its
own thread (``bus.protocol.send.sender``): if the token transaction failed, its outcome is
unknown, so the caller fences its attempt ids and sends alone with fresh ones; if a bundle
failed, the caller sends its signals again alone.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from bus.envelope import Envelope
from bus.groups import Gate, GroupCommit
from bus.protocol.copies.bundles import MAX_PARTS
from bus.protocol.copies.courier import Courier
from bus.storage import StorageError

__all__ = ["MAX_GROUP", "Gate", "SendGroup", "Ticket"]

MAX_GROUP = MAX_PARTS
"""Copies per flush: one bundle's worth (more wait for the next flush)."""


class Ticket:
    """One caller's copies in a group, and what became of them."""

    def __init__(self, envelopes: Sequence[Envelope]) -> None:
        self.envelopes = envelopes
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
        self._group: GroupCommit[Ticket] = GroupCommit(
            self._flush, gate, limit=MAX_GROUP, weight=lambda ticket: len(ticket.envelopes))

    @property
    def flushes(self) -> int:
        return self._group.flushes

    @property
    def grouped(self) -> int:
        return self._group.grouped

    @property
    def waiting(self) -> int:
        return self._group.waiting

    @property
    def busy(self) -> bool:
        return self._group.busy

    def submit(self, envelopes: Sequence[Envelope]) -> Ticket:
        """Put ``envelopes`` on their way together with whatever else is waiting; returns once
        a flush has dealt with them (see ``Ticket`` for what it left undone)."""
        ticket = Ticket(envelopes)
        self._group.submit(ticket)
        return ticket

    def _flush(self, group: list[Ticket]) -> None:
        envelopes = [envelope for ticket in group for envelope in ticket.envelopes]
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
