"""One signal's ``process`` span and what its end records.

The span starts once the signal is decoded (so it can name its message and link to the span
that created it) and ends when the receiver has its result. It is the current span while the
bus works on that signal alone - admission, the handler, poisoning - so the handler's own spans,
its ``create`` spans and its log records belong to it; storage requests shared by a batch's
signals (one token read for all of them) are not under any one signal's span.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

from opentelemetry.trace import Span, Status, StatusCode, use_span

from bus.envelope import Envelope
from bus.observability import conventions as sc
from bus.observability.metrics import Instruments
from bus.observability.propagation import carrier

_current: ContextVar[Processing | None] = ContextVar("eobus_processing", default=None)

_FAILED = {"poisoned", "expired", sc.RETRY, sc.ERROR}


def note_error(kind: str) -> None:
    """Say why the signal being processed failed (``error.type``): called where the bus
    poisons it, which knows the reason's kind. Nothing happens outside a process span."""
    processing = _current.get()
    if processing is not None and processing.error_type is None:
        processing.error_type = kind


@dataclass
class Processing:
    """One signal's process span, its start, and why it failed (when it did)."""

    span: Span
    endpoint: str
    instruments: Instruments
    envelope: Envelope | None = None
    error_type: str | None = None
    started: float = field(default_factory=time.perf_counter)

    @contextmanager
    def active(self) -> Iterator[None]:
        """Make this the current span (and the signal whose errors ``note_error`` notes)."""
        token = _current.set(self)
        try:
            with use_span(self.span, end_on_exit=False, record_exception=False,
                          set_status_on_exception=False):
                yield
        finally:
            _current.reset(token)

    def carrier(self) -> dict[str, str]:
        """This span's context as headers (what a Durable orchestration it starts carries)."""
        with use_span(self.span, end_on_exit=False):
            return carrier()

    def finish(self, outcome: str, exc: BaseException | None, now: float) -> None:
        """End the span with the signal's outcome and record the metrics: ``outcome`` is an
        ``Outcome`` value, ``retry`` (the handler raised; ``exc`` is HandlerFailed) or
        ``error`` (``exc``: storage failed, the outcome is unknown)."""
        if exc is not None and self.error_type is None:
            cause = exc.__cause__ if outcome == sc.RETRY and exc.__cause__ else exc
            self.error_type = sc.error_type(cause)
        if outcome in _FAILED and self.error_type is None:
            self.error_type = outcome
        attributes: dict[str, str] = {sc.MESSAGING_SYSTEM: sc.SYSTEM,
                                      sc.OPERATION_NAME: "process",
                                      sc.DESTINATION: self.endpoint, sc.OUTCOME: outcome}
        if self.error_type is not None:
            attributes[sc.ERROR_TYPE] = self.error_type
        self._end_span(outcome, exc)
        self.instruments.consumed.add(1, attributes)
        self.instruments.process_duration.record(time.perf_counter() - self.started,
                                                 attributes)
        if outcome == "processed" and self.envelope is not None:
            due = self.envelope.not_before or self.envelope.sent_at
            self.instruments.end_to_end.record(max(0.0, now - due.timestamp()), {
                sc.MESSAGING_SYSTEM: sc.SYSTEM, sc.DESTINATION: self.endpoint})

    def _end_span(self, outcome: str, exc: BaseException | None) -> None:
        span = self.span
        if span.is_recording():
            span.set_attribute(sc.OUTCOME, outcome)
            if self.error_type is not None:
                span.set_attribute(sc.ERROR_TYPE, self.error_type)
                span.set_status(Status(StatusCode.ERROR, outcome))
            if exc is not None:
                span.record_exception(exc)
        span.end()


def process_attributes(endpoint: str, envelope: Envelope | None,
                       delivery_count: int) -> Mapping[str, str | int]:
    """The process span's attributes known when it starts."""
    attributes: dict[str, str | int] = {
        sc.MESSAGING_SYSTEM: sc.SYSTEM, sc.OPERATION_NAME: "process",
        sc.OPERATION_TYPE: sc.PROCESS, sc.DESTINATION: endpoint,
        sc.DELIVERY_COUNT: delivery_count}
    if envelope is not None:
        attributes.update({
            sc.MESSAGE_ID: envelope.message_id, sc.CONVERSATION_ID: envelope.correlation_id,
            sc.ATTEMPT_ID: envelope.attempt_id, sc.MESSAGE_TYPE: envelope.message_type})
        if envelope.causation_id is not None:
            attributes[sc.CAUSATION_ID] = envelope.causation_id
        if envelope.topic is not None:
            attributes[sc.TOPIC] = envelope.topic
        if envelope.session is not None:
            attributes[sc.SESSION] = envelope.session
    return attributes
