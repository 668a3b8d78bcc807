"""Sending from outside a handler (a client, a script, a Spark job): token, then signal.

There is no outbox here, so the guarantee is per call: a ``send`` that returns has put each copy
on its way exactly once. A token request whose outcome is unknown is fenced and replaced by a
fresh attempt id, so a late ("ghost") request can never make the copy processable twice. A
``send`` that raises may or may not have sent; senders that need idempotent re-sends should send
from a handler (whose outbox makes them exactly-once) or keep their own record.

Concurrent sends share their requests (``bus.protocol.send.group``); what a shared flush left
undone, each caller finishes here alone, by the same rules: tokens of unknown outcome are
fenced and replaced, signals that did not go are sent again (tokens deduplicate them).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from tenacity import Retrying

from bus.backoff import exponential, transient_retries
from bus.envelope import Envelope
from bus.ids import IdFactory
from bus.protocol.copies.courier import Courier
from bus.protocol.send.group import Gate, SendGroup, Ticket
from bus.storage import Conflict, TransientError


class Sender:
    def __init__(self, *, courier: Courier, new_id: IdFactory,
                 sleep: Callable[[float], None], attempts: int = 5,
                 group: bool = True, gate: Callable[[], Gate] = threading.Event,
                 fence: bool = True) -> None:
        self._courier = courier
        self._fence = fence  # off only for the simulation's "reuse-send-ids" break
        self._new_id = new_id
        self._sleep = sleep
        self._attempts = attempts
        self.group = SendGroup(courier, gate) if group else None
        self.repaired = 0
        """Copies a group's flush left undone, finished alone (statistics; not locked)."""

    def send(self, envelopes: list[Envelope], *, room_checked: bool = False) -> None:
        """Raises QueueFull before anything is written when a destination's queue is full -
        unless the caller checked every destination already (``room_checked``: it numbered
        the copies afterwards, so they go out whatever the depth reads now)."""
        if not room_checked:
            for envelope in envelopes:
                self._courier.check_room(envelope.destination)
        # A claim-check payload goes alone: its blob upload would hold up the whole group.
        if self.group is None or not all(map(self._courier.fits, envelopes)):
            for envelope in envelopes:
                self._alone(envelope)
            return
        self._finish(self.group.submit(envelopes))

    def _finish(self, ticket: Ticket) -> None:
        """Do what the group's flush left undone for this caller's copies."""
        problems = ticket.problems or [None] * len(ticket.envelopes)
        for envelope, problem in zip(ticket.envelopes, problems, strict=True):
            if not ticket.placed:
                self.repaired += 1
                self._alone(self._replaced(envelope))
            elif ticket.problems is None or problem is not None:
                self.repaired += 1
                self._retrying()(self._courier.signal, envelope, check_room=False)

    def _alone(self, envelope: Envelope) -> None:
        placed = self._place(envelope)
        self._retrying()(self._courier.signal, placed, check_room=False)

    def _place(self, envelope: Envelope) -> Envelope:
        for _ in range(self._attempts):
            try:
                self._courier.place(envelope)
                return envelope
            except TransientError:
                envelope = self._replaced(envelope)
            except Conflict:
                if self._fence:
                    raise
                return envelope  # the break: "that token must be the one I created"
        raise TransientError(f"could not create an inbox token for {envelope.message_id} "
                             f"after {self._attempts} attempts")

    def _replaced(self, envelope: Envelope) -> Envelope:
        """The copy with a fresh attempt id, once its old one (its token request's outcome is
        unknown; a late one may still land) can never be processed."""
        if not self._fence:
            return envelope
        self._retrying()(self._courier.fence, envelope.destination, envelope.attempt_id,
                         envelope.message_id)
        fresh = envelope.model_copy(update={"attempt_id": self._new_id()})
        return self._courier.sealer.resign(fresh)  # the signature covers the attempt id

    def _retrying(self) -> Retrying:
        return transient_retries(self._attempts, exponential(), self._sleep)
