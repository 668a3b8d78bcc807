"""``Telemetry``: the bus's tracer and meter, and the spans each part of the bus opens."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import TypeVar

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode, TracerProvider

from bus.envelope import HEADER_VALUE_CHARS, MAX_HEADERS, Envelope
from bus.observability import conventions as sc
from bus.observability.depth import QueueDepths, depth_gauge
from bus.observability.metrics import Instruments
from bus.observability.processing import Processing, process_attributes
from bus.observability.propagation import extract, inject, link_to

T = TypeVar("T")

_NAME = "eobus"
MAX_LINKS = 128
"""Links one ``send`` or ``receive`` span keeps to the creation spans of the copies it moves
(a Durable fan-out's batch signals 16; a record of thousands of copies keeps the first 128)."""
Attributes = Mapping[str, str | int]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(_NAME)
    except PackageNotFoundError:  # running from a source tree that was not installed
        return "0"


class Telemetry:
    """The tracer and meter the bus reports to: the global providers by default (no-ops until
    an SDK is installed, at any time), or the ones given (tests, several apps in a process).

    ``storage_metrics``: also time every storage request of the protocol
    (``eobus.storage.operation.duration``, about 2.6 measurements per message). Off by
    default: with a recording SDK it is a fifth of the bus's telemetry cost
    (docs/performance.md, "Tracing"), and the Azure SDKs' own tracing times each request too.
    """

    def __init__(self, *, tracer_provider: TracerProvider | None = None,
                 meter_provider: MeterProvider | None = None,
                 storage_metrics: bool = False) -> None:
        self.storage_metrics = storage_metrics
        version = _version()
        self.tracer = trace.get_tracer(_NAME, version, tracer_provider)
        meter = metrics.get_meter(_NAME, version, meter_provider)
        self.metrics = Instruments(meter)
        self._depths = depth_gauge(meter, meter_provider)

    def alerted(self, condition: str, endpoint: str) -> None:
        """An alert condition holds at ``endpoint`` (``eobus.alerts``)."""
        self.metrics.alerts.add(1, {sc.MESSAGING_SYSTEM: sc.SYSTEM, sc.ALERT: condition,
                                    sc.DESTINATION: endpoint})

    def watch_depths(self, depths: QueueDepths) -> None:
        """Report the queue lengths of the endpoints a host serves (``eobus.queue.depth``)
        while the host holds ``depths``."""
        self._depths.watch(depths)

    # -- context in envelopes --------------------------------------------------------------
    @staticmethod
    def inject(headers: dict[str, str]) -> None:
        """Put the current span's context into an envelope's ``headers`` (when it fits)."""
        inject(headers, max_headers=MAX_HEADERS, max_value_chars=HEADER_VALUE_CHARS)

    @staticmethod
    @contextmanager
    def continued(headers: Mapping[str, str] | None) -> Iterator[None]:
        """Run the block in the context ``headers`` carry (a Durable activity's input, an
        invocation's trace context): what the bus does there is part of that trace."""
        if not headers:
            yield
            return
        token = otel_context.attach(extract(headers))
        try:
            yield
        finally:
            otel_context.detach(token)

    # -- producing -------------------------------------------------------------------------
    def sending(self, operation: str, destination: str, *, message_id: str,
                correlation_id: str | None, message_type: str,
                ) -> AbstractContextManager[Span]:
        """A client's send (``operation`` ``send``) or publish of one message: a PRODUCER
        span, current while its copies are made, so they carry its context."""
        attributes: dict[str, str | int] = {sc.MESSAGE_ID: message_id,
                                            sc.MESSAGE_TYPE: message_type}
        if correlation_id is not None:
            attributes[sc.CONVERSATION_ID] = correlation_id
        return self._operation(operation, sc.SEND, destination, kind=SpanKind.PRODUCER,
                               attributes=attributes)

    def creating(self, destination: str, *, message_id: str, correlation_id: str,
                 message_type: str) -> AbstractContextManager[Span]:
        """One message made inside a handler or for a batch send: its ``create`` span, whose
        context its copies carry."""
        return self._operation("create", sc.CREATE, destination, kind=SpanKind.PRODUCER,
                               attributes={
            sc.MESSAGE_ID: message_id, sc.CONVERSATION_ID: correlation_id,
            sc.MESSAGE_TYPE: message_type})

    def signalling(self, envelopes: Sequence[Envelope]) -> AbstractContextManager[Span]:
        """Signals sent for copies made earlier (after a commit, by a Durable activity, for a
        batch send): a CLIENT ``send`` span linked to the copies' ``create`` spans."""
        destinations = sorted({e.destination for e in envelopes})
        destination = destinations[0] if len(destinations) == 1 else ""
        return self._operation("send", sc.SEND, destination, kind=SpanKind.CLIENT,
                               attributes={sc.BATCH_COUNT: len(envelopes)},
                               links=_links(envelopes))

    def signalled(self, destination: str, copies: int) -> None:
        """Count copies put on ``destination``'s queue (``messaging.client.sent.messages``)."""
        self.metrics.sent.add(copies, {sc.MESSAGING_SYSTEM: sc.SYSTEM,
                                       sc.OPERATION_NAME: "send",
                                       sc.DESTINATION: destination})

    # -- consuming -------------------------------------------------------------------------
    def received(self, endpoint: str, messages: int, started_ns: int,
                 envelopes: Sequence[Envelope] = ()) -> None:
        """A polling host's lease of a batch from ``endpoint``'s queue that began at
        ``started_ns`` (``time.time_ns``):
        a CLIENT ``receive`` span, made afterwards and only when it leased messages - an
        idle host polls every few seconds, and a span per empty poll is noise that costs.
        ``envelopes``: the copies taken, when the receiver is their consumer (a Spark read):
        the span links to their ``create`` spans."""
        if not messages:
            return
        attributes = {sc.MESSAGING_SYSTEM: sc.SYSTEM, sc.OPERATION_NAME: "receive",
                      sc.DESTINATION: endpoint}
        span = self.tracer.start_span(
            f"receive {endpoint}", kind=SpanKind.CLIENT, start_time=started_ns,
            links=_links(envelopes),
            attributes={**attributes, sc.OPERATION_TYPE: sc.RECEIVE, sc.BATCH_COUNT: messages})
        span.end()
        self.metrics.operation_duration.record((time.time_ns() - started_ns) / 1e9, attributes)

    def settling(self, endpoint: str, settlement: str) -> AbstractContextManager[Span]:
        """A polling host's delete (``settlement`` ``delete``) or release of a message
        leased from ``endpoint``'s queue."""
        return self._operation("settle", sc.SETTLE, endpoint, kind=SpanKind.CLIENT,
                               attributes={sc.SETTLEMENT: settlement})

    def process(self, endpoint: str, envelope: Envelope | None, delivery_count: int, *,
                parent_on_message: bool) -> Processing:
        """Start one signal's CONSUMER span (``bus.observability.processing``).

        Its parent is the current span - a Functions invocation's - with a link to the span
        that created the message (the conventions' default); with no current span, or with
        ``parent_on_message`` (``Settings.process_span_parent``), the creation span is its
        parent, linked to the current span when there is one: one trace from the first send
        to the last handler."""
        ambient = trace.get_current_span().get_span_context()
        creation = extract(envelope.headers) if envelope is not None else None
        created = (trace.get_current_span(creation).get_span_context()
                   if creation is not None else trace.INVALID_SPAN_CONTEXT)
        parent: otel_context.Context | None = None
        links: list[Link] = []
        if created.is_valid and (parent_on_message or not ambient.is_valid):
            parent = creation
            if ambient.is_valid:
                links.append(Link(ambient))
        elif created.is_valid:
            links.append(Link(created))
        span = self.tracer.start_span(
            f"process {endpoint}", context=parent, kind=SpanKind.CONSUMER, links=links,
            attributes=process_attributes(endpoint, envelope, delivery_count))
        return Processing(span, endpoint, self.metrics, envelope)

    # -- storage ---------------------------------------------------------------------------
    def call(self, service: str, operation: str, fn: Callable[[], T]) -> T:
        """One storage request, timed (``bus.storage.observed.Observer``)."""
        started = time.perf_counter()
        error: str | None = None
        try:
            return fn()
        except Exception as exc:
            error = sc.error_type(exc)
            raise
        finally:
            attributes = {sc.STORAGE_SERVICE: service, sc.STORAGE_OPERATION: operation}
            if error is not None:
                attributes[sc.ERROR_TYPE] = error
            self.metrics.storage_duration.record(time.perf_counter() - started, attributes)

    # -- shared ----------------------------------------------------------------------------
    @contextmanager
    def _operation(self, name: str, operation_type: str, destination: str, *, kind: SpanKind,
                   attributes: Attributes, links: Sequence[Link] = ()) -> Iterator[Span]:
        common = {sc.MESSAGING_SYSTEM: sc.SYSTEM, sc.OPERATION_NAME: name}
        if destination:
            common[sc.DESTINATION] = destination
        started = time.perf_counter()
        error: str | None = None
        with self.tracer.start_as_current_span(
                f"{name} {destination}".rstrip(), kind=kind, links=links,
                attributes={**common, sc.OPERATION_TYPE: operation_type, **attributes},
                record_exception=False, set_status_on_exception=False) as span:
            try:
                yield span
            except BaseException as exc:
                error = sc.error_type(exc)
                # The type only: a storage error's text can hold a request's URL.
                if span.is_recording():
                    span.set_attribute(sc.ERROR_TYPE, error)
                    span.set_status(Status(StatusCode.ERROR, error))
                raise
            finally:
                if operation_type != sc.CREATE:  # made in memory: its span says enough
                    if error is not None:
                        common[sc.ERROR_TYPE] = error
                    self.metrics.operation_duration.record(time.perf_counter() - started,
                                                           common)


def _links(envelopes: Sequence[Envelope]) -> list[Link]:
    """Links to the creation spans the copies name, each once, at most ``MAX_LINKS``."""
    links: list[Link] = []
    seen: set[int] = set()
    for envelope in envelopes:
        if len(links) >= MAX_LINKS:
            break
        link = link_to(envelope.headers)
        if link is not None and link.context.span_id not in seen:
            seen.add(link.context.span_id)
            links.append(link)
    return links
