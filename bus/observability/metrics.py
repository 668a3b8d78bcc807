"""The bus's instruments (``Telemetry.metrics``).

After the messaging conventions: ``messaging.client.sent.messages`` (each copy signalled),
``messaging.client.consumed.messages`` (each signal's outcome, ``eobus.outcome``: poison and
retry counts are its ``poisoned`` and ``retry`` values), ``messaging.client.operation.duration``
(send, receive, settle), ``messaging.process.duration``. The bus's own:
``eobus.storage.operation.duration`` (every storage request, by service and operation),
``eobus.message.end_to_end.duration`` (from when a copy was due to when it was processed) and
``eobus.queue.depth`` (``bus.observability.depth``), ``eobus.alerts`` (``bus.hosting.alerts``).
"""

from __future__ import annotations

from opentelemetry.metrics import Meter

from bus.observability.conventions import DURATION_BUCKETS, END_TO_END_BUCKETS


class Instruments:
    def __init__(self, meter: Meter) -> None:
        self.meter = meter
        self.sent = meter.create_counter(
            "messaging.client.sent.messages", unit="{message}",
            description="Message copies the bus signalled to a queue")
        self.consumed = meter.create_counter(
            "messaging.client.consumed.messages", unit="{message}",
            description="Signals the bus received, by outcome")
        self.operation_duration = meter.create_histogram(
            "messaging.client.operation.duration", unit="s",
            description="Duration of send, receive and settle operations",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS)
        self.process_duration = meter.create_histogram(
            "messaging.process.duration", unit="s",
            description="Duration of processing one signal, handler and commit included",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS)
        self.storage_duration = meter.create_histogram(
            "eobus.storage.operation.duration", unit="s",
            description="Duration of one Azure Storage request",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS)
        self.alerts = meter.create_counter(
            "eobus.alerts", unit="{alert}",
            description="Alert conditions found holding by a maintenance pass "
                        "(bus.hosting.alerts), by condition and endpoint")
        self.end_to_end = meter.create_histogram(
            "eobus.message.end_to_end.duration", unit="s",
            description="From when a message copy was due to when it was processed",
            explicit_bucket_boundaries_advisory=END_TO_END_BUCKETS)
