"""Trace context in envelope headers: W3C ``traceparent`` and ``tracestate``.

Storage queue messages have no properties, so the context travels inside the envelope, as
two of its headers (docs/envelope.md, "Trace context"). They are written when the envelope
is made - before it is signed - and never changed afterwards: an outbox record keeps its
envelopes, so a record sent again (by another worker, by maintenance, by a Durable
orchestration) carries the context of the handler run that made it.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping

from opentelemetry.context import Context
from opentelemetry.trace import Link, get_current_span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

TRACEPARENT, TRACESTATE = "traceparent", "tracestate"
_W3C = TraceContextTextMapPropagator()


def inject(headers: MutableMapping[str, str], *, max_headers: int,
           max_value_chars: int) -> None:
    """Add the current span's context to ``headers`` - unless it has a ``traceparent``
    already (a producer that set its own wins), there is no valid current span, or there
    is no room: the headers' count and value length are limited (``bus.envelope``), and the
    user's headers come first. A ``tracestate`` too long for a header is left out."""
    if TRACEPARENT in headers or not get_current_span().get_span_context().is_valid:
        return
    carrier: dict[str, str] = {}
    _W3C.inject(carrier)
    wanted = {name: value for name, value in carrier.items()
              if len(value) <= max_value_chars}
    if TRACEPARENT in wanted and len(headers) + len(wanted) <= max_headers:
        headers.update(wanted)


def extract(headers: Mapping[str, str]) -> Context:
    """The context ``headers`` carry (an empty one when they carry none, or a malformed
    one: foreign producers write these headers too)."""
    return _W3C.extract(dict(headers))


def carrier() -> dict[str, str]:
    """The current context as headers (for a Durable activity's input)."""
    found: dict[str, str] = {}
    _W3C.inject(found)
    return found


def link_to(headers: Mapping[str, str]) -> Link | None:
    """A link to the span that created a message, when its headers name one."""
    context = get_current_span(extract(headers)).get_span_context()
    return Link(context) if context.is_valid else None
