"""Sending from outside a handler (a client, a script, a Spark job): token, then signal.

There is no outbox here, so the guarantee is per call: a ``send`` that returns has put each copy
on its way exactly once. A token request whose outcome is unknown is fenced and replaced by a
fresh attempt id, so a late ("ghost") request can never make the copy processable twice. A
``send`` that raises may or may not have sent; senders that need idempotent re-sends should send
from a handler (whose outbox makes them exactly-once) or keep their own record.
"""

from __future__ import annotations

from collections.abc import Callable

from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from bus.envelope import Envelope
from bus.ids import IdFactory
from bus.protocol.courier import Courier
from bus.storage import TransientError


class Sender:
    def __init__(self, *, courier: Courier, new_id: IdFactory,
                 sleep: Callable[[float], None], attempts: int = 5) -> None:
        self._courier = courier
        self._new_id = new_id
        self._sleep = sleep
        self._attempts = attempts

    def send(self, envelopes: list[Envelope]) -> None:
        """Raises QueueFull before anything is written when a destination's queue is full."""
        for envelope in envelopes:
            self._courier.check_room(envelope.destination)
        for envelope in envelopes:
            placed = self._place(envelope)
            self._retrying()(self._courier.signal, placed, check_room=False)

    def _place(self, envelope: Envelope) -> Envelope:
        for _ in range(self._attempts):
            try:
                self._courier.place(envelope)
                return envelope
            except TransientError:
                self._retrying()(self._courier.fence, envelope.destination,
                                 envelope.attempt_id, envelope.message_id)
                envelope = envelope.model_copy(update={"attempt_id": self._new_id()})
        raise TransientError(f"could not create an inbox token for {envelope.message_id} "
                             f"after {self._attempts} attempts")

    def _retrying(self) -> Retrying:
        return Retrying(stop=stop_after_attempt(self._attempts),
                        wait=wait_exponential(multiplier=0.05, max=2.0),
                        retry=retry_if_exception_type(TransientError),
                        sleep=self._sleep, reraise=True)
