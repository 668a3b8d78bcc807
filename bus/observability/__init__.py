"""OpenTelemetry traces and metrics for the bus (docs/observability.md).

The bus depends on ``opentelemetry-api`` only: without an SDK every span and instrument is
a no-op, and trace context still travels in the envelopes' headers. An application that
installs an SDK (or Application Insights through ``azure-monitor-opentelemetry``) sees:

* spans after the messaging semantic conventions - ``send``/``publish`` (a client's send),
  ``create`` (each message a handler or a batch makes), ``send`` (the signals after a
  commit), ``receive`` (a polling host's lease), ``process`` (one per signal, bundles
  included) and ``settle`` (a polling host's delete or release) - with the bus's own
  attributes under ``eobus.*`` (``bus.observability.conventions``);
* W3C ``traceparent``/``tracestate`` headers in every envelope it sends
  (``bus.observability.propagation``), kept in the outbox record and sent unchanged;
* metrics (``bus.observability.metrics``).

``Telemetry`` is what a ``Bus`` is given (``Bus(..., telemetry=Telemetry(...))``); the default
uses the global providers, which may be installed after the bus is built.
"""

from bus.observability.processing import Processing, note_error
from bus.observability.telemetry import Telemetry

__all__ = ["Processing", "Telemetry", "note_error"]
