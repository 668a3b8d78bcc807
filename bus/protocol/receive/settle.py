"""Settling a message before its poisoned token goes: its unfinished outbox record completed.

A message's handler can commit and the message still end in the poison queue: its record's
sends wait for room at a full queue while its deliveries run out (the Functions host then moves
it to the poison queue itself, and maintenance adopts it), or storage fails on every delivery
after the commit (``Poisoning.give_up``). Its token stays until the record is finished - that
is what tells the partition the record's work is not done (``inbox.finished``). A purge
deletes the token, so before it does, ``settle`` finds the message's partition the way the
receiver does (its payload decoded into its route's contract) and, when the slot still holds
the message's unfinished record, completes it - which consumes the token. When the record
cannot be completed now (no room yet, storage failing) ``settle`` raises, and the purge keeps
that entry. A message that never reached its handler (no payload, a copy the endpoint would
poison) has no record to settle. A copy of a session that waited for its turn stays in the
session's waiting list when it is poisoned later (a poisoned copy commits nothing), which
maintenance tells from its poisoned token; once purged, its token is gone, so ``settle`` takes
it out of the list (``Sessions.forget``): its number becomes a gap like any other.
"""

from __future__ import annotations

from bus.endpoint import Endpoint
from bus.envelope import BadSignal, Envelope
from bus.errors import PayloadError
from bus.protocol.copies.payloads import Payloads
from bus.protocol.copies.sealing import Sealer
from bus.protocol.outbox.dispatch import Dispatcher
from bus.protocol.outbox.slot import Outbox
from bus.protocol.receive.admission import EndpointRouting
from bus.protocol.sessions.admin import Sessions
from bus.protocol.tokens.inbox import Inbox, finished


class Settler:
    """Completes the unfinished record of a message of one endpoint, if it has one."""

    def __init__(self, *, endpoint: Endpoint, routing: EndpointRouting, payloads: Payloads,
                 sealer: Sealer, inbox: Inbox, outbox: Outbox, dispatcher: Dispatcher,
                 sessions: Sessions, complete: bool = True) -> None:
        """``complete``: complete the message's unfinished record (off: the simulation's
        break)."""
        self._sessions = sessions
        self._complete = complete
        self._endpoint = endpoint
        self._routing = routing
        self._payloads = payloads
        self._sealer = sealer
        self._inbox = inbox
        self._outbox = outbox
        self._dispatcher = dispatcher

    def settle(self, envelope: Envelope) -> None:
        """Complete the message's unfinished record, if any, and take it out of its session's
        waiting list. Raises what completing it raised
        (QueueFull: no room yet; a StorageError; ClaimLost: someone else moved the slot on -
        call again)."""
        partition = self._partition(envelope)
        if partition is None:
            return
        slot = self._outbox.load(partition)
        record = slot.record
        # A record is replaced only once it is finished: one of another message means this
        # one's is finished (or never was).
        if self._complete and record is not None and record.is_for(envelope) and not finished(
                record, self._inbox.read(self._endpoint.name, record.attempt_id)):
            self._dispatcher.complete(slot, committed_by_me=False)
        if envelope.session is not None:
            self._sessions.forget(envelope.session, partition, envelope.message_id)

    def _partition(self, envelope: Envelope) -> str | None:
        """The message's partition, as the receiver found it; None when no handler could
        have committed it."""
        if self._routing.refusal(envelope) is not None or not self._payloads.confined(
                envelope, self._endpoint.name):
            return None
        try:
            data = self._payloads.of(envelope)
            if data is None:
                return None
            return self._routing.decode(envelope, self._sealer.open(envelope, data)).partition
        except (BadSignal, PayloadError):  # over the limit or not readable: never handled
            return None
