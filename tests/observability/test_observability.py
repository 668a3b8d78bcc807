"""Traces and metrics through the OpenTelemetry SDK's in-memory exporter and reader: one trace
from a client's send to both subscribers' handlers, through a bundle; the conventions'
attributes; poisoned messages' ``error.type``; metrics counted; nothing when no SDK is on."""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from bus import Bus, Command, Context, Endpoint, Reject, RetryPolicy, Settings
from bus.envelope import MAX_HEADERS, decode_signal
from bus.hosting.functions.trigger import QueueTrigger
from bus.observability import Telemetry
from bus.protocol.delivery import Delivery, Incoming
from bus.storage import Storage
from bus.testing import drain
from tests.support.orderflow import PlaceOrder, build


@dataclass
class Recorded:
    exporter: InMemorySpanExporter
    reader: InMemoryMetricReader
    telemetry: Telemetry
    meter_provider: MeterProvider

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.spans() if s.name == name]

    def one(self, name: str) -> ReadableSpan:
        [span] = self.named(name)
        return span

    def points(self, metric: str) -> list[tuple[dict[str, object], object]]:
        """(attributes, value or histogram count) of each data point of ``metric``."""
        data = self.reader.get_metrics_data()
        found = []
        for resource in data.resource_metrics if data else []:
            for scope in resource.scope_metrics:
                for m in scope.metrics:
                    if m.name == metric:
                        for p in m.data.data_points:
                            found.append((dict(p.attributes or {}),
                                          getattr(p, "value", getattr(p, "count", None))))
        return found


@pytest.fixture
def recorded() -> Iterator[Recorded]:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    yield Recorded(exporter, reader, Telemetry(tracer_provider=tracer_provider,
                                               meter_provider=meter_provider), meter_provider)
    tracer_provider.shutdown()
    meter_provider.shutdown()


def _parent(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def test_one_trace_from_a_command_to_both_subscribers(storage: Storage, prefix: str,
                                                      recorded: Recorded) -> None:
    bus = build(storage, prefix, telemetry=recorded.telemetry)
    message_id = bus.send(PlaceOrder(order_id="o1", amount=5))
    drain(bus)

    send = recorded.one("send orders")
    assert send.kind is SpanKind.PRODUCER and send.parent is None
    assert send.attributes is not None
    assert dict(send.attributes) == {
        "messaging.system": "eobus", "messaging.operation.name": "send",
        "messaging.operation.type": "send", "messaging.destination.name": "orders",
        "messaging.message.id": message_id, "messaging.message.conversation_id": message_id,
        "eobus.message.type": "PlaceOrder"}
    orders = recorded.one("process orders")
    assert orders.kind is SpanKind.CONSUMER and _parent(orders) == send.context.span_id
    assert orders.attributes is not None
    assert orders.attributes["eobus.outcome"] == "processed"
    assert orders.attributes["messaging.message.id"] == message_id
    assert orders.attributes["eobus.delivery.count"] == 1
    assert "error.type" not in orders.attributes
    create = recorded.one("create OrderPlaced")
    assert create.kind is SpanKind.PRODUCER and _parent(create) == orders.context.span_id
    # The signals after the commit: a CLIENT send linked to the create span.
    [dispatch] = [s for s in recorded.named("send") + recorded.named("send billing")
                  + recorded.named("send shipping") if s.kind is SpanKind.CLIENT]
    assert [link.context.span_id for link in dispatch.links] == [create.context.span_id]
    assert dispatch.attributes is not None
    assert dispatch.attributes["messaging.batch.message_count"] == 2
    for subscriber in ("billing", "shipping"):
        span = recorded.one(f"process {subscriber}")
        assert _parent(span) == create.context.span_id
        assert span.attributes is not None
        assert span.attributes["eobus.topic"] == "OrderPlaced"
        assert span.attributes["messaging.message.conversation_id"] == message_id
    processing = [s for s in recorded.spans() if s.name.startswith(("process", "send",
                                                                    "create"))]
    assert {s.context.trace_id for s in processing} == {send.context.trace_id}
    # The polling host's own operations: a receive per leased batch, a settle per message.
    assert recorded.named("receive orders") and recorded.named("settle orders")
    [settle] = recorded.named("settle orders")
    assert settle.attributes is not None and settle.attributes["eobus.settlement"] == "delete"


class Start(Command):
    key: str
    parts: int


class Part(Command):
    key: str
    index: int


def test_each_part_of_a_bundle_has_its_own_process_span(storage: Storage, prefix: str,
                                                        recorded: Recorded) -> None:
    fan, parts = Endpoint("fan"), Endpoint("parts")
    handled: list[int] = []

    @fan.handles(Start, partition=lambda m: m.key)
    def start(message: Start, ctx: Context) -> None:
        for index in range(message.parts):
            ctx.send(Part(key=f"{message.key}-{index}", index=index))

    @parts.handles(Part, partition=lambda m: m.key)
    def part(message: Part, ctx: Context) -> None:
        handled.append(message.index)

    bus = Bus(storage, [fan, parts], prefix=prefix, telemetry=recorded.telemetry)
    bus.provision()
    bus.send(Start(key="k", parts=3))
    drain(bus, ["fan"])
    # The three copies travel in one queue message: a bundle.
    [message] = bus.storage.queues.receive(bus.names.queue("parts"), max_messages=32,
                                           lease=30)
    assert bus.parts.courier.bundled == 3
    bus.storage.queues.extend(bus.names.queue("parts"), message, lease=0)
    drain(bus, ["parts"])
    assert sorted(handled) == [0, 1, 2]

    creates = recorded.named("create parts")
    processes = recorded.named("process parts")
    assert len(creates) == len(processes) == 3
    assert sorted(_parent(p) or 0 for p in processes) == sorted(c.context.span_id
                                                               for c in creates)
    [receive] = recorded.named("receive parts")
    assert receive.attributes is not None
    assert receive.attributes["messaging.batch.message_count"] == 1
    [send] = [s for s in recorded.named("send parts") if s.kind is SpanKind.CLIENT]
    assert {link.context.span_id for link in send.links} == {c.context.span_id
                                                              for c in creates}
    assert len({s.context.trace_id for s in recorded.spans()
                if not s.name.startswith(("receive", "settle"))}) == 1


def test_the_trace_context_travels_in_the_envelope_headers(storage: Storage, prefix: str,
                                                           recorded: Recorded) -> None:
    bus = build(storage, prefix, telemetry=recorded.telemetry)
    bus.send(PlaceOrder(order_id="o1", amount=5), headers={"tenant": "t1"})
    [message] = bus.storage.queues.receive(bus.names.queue("orders"), max_messages=1,
                                           lease=30)
    envelope = decode_signal(message.body)
    send = recorded.one("send orders")
    assert envelope.headers["tenant"] == "t1"
    # Sampled (bit 0); the SDK may set the W3C level 2 "random" bit too.
    version, trace_id, span_id, flags = envelope.headers["traceparent"].split("-")
    assert (version, trace_id, span_id) == ("00", f"{send.context.trace_id:032x}",
                                            f"{send.context.span_id:016x}")
    assert int(flags, 16) & 1


def test_a_producer_s_own_traceparent_wins_and_full_headers_stay_as_they_are(
        storage: Storage, prefix: str, recorded: Recorded) -> None:
    bus = build(storage, prefix, telemetry=recorded.telemetry)
    theirs = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    bus.send(PlaceOrder(order_id="o1", amount=5), headers={"traceparent": theirs})
    full = {f"h{i}": "v" for i in range(MAX_HEADERS)}
    bus.send(PlaceOrder(order_id="o2", amount=5), headers=full)
    bodies = bus.storage.queues.receive(bus.names.queue("orders"), max_messages=2, lease=30)
    headers = sorted((decode_signal(m.body).headers for m in bodies), key=len)
    assert headers == [{"traceparent": theirs}, full]
    for message in bodies:  # visible again
        bus.storage.queues.extend(bus.names.queue("orders"), message, lease=0)
    drain(bus)
    # The process span of the first continues the producer's trace.
    spans = {s.parent.trace_id for s in recorded.named("process orders") if s.parent}
    assert int(theirs.split("-")[1], 16) in spans


def test_without_an_sdk_nothing_is_recorded_and_no_context_is_sent(storage: Storage,
                                                                   prefix: str) -> None:
    bus = build(storage, prefix)  # the global providers: no SDK installed in this process
    bus.send(PlaceOrder(order_id="o1", amount=5))
    [message] = bus.storage.queues.receive(bus.names.queue("orders"), max_messages=1,
                                           lease=30)
    assert "traceparent" not in decode_signal(message.body).headers


def test_a_poisoned_message_s_span_carries_error_type(storage: Storage, prefix: str,
                                                      recorded: Recorded) -> None:
    desk = Endpoint("desk")

    @desk.handles(PlaceOrder, partition=lambda m: m.order_id,
                  retry=RetryPolicy(delays=(0.0,)))  # redelivered at once
    def refuse(message: PlaceOrder, ctx: Context) -> None:
        if message.amount < 0:
            raise Reject("negative amount")
        raise KeyError("no such customer")

    bus = Bus(storage, [desk], prefix=prefix, telemetry=recorded.telemetry,
              settings=Settings(max_delivery_count=2))
    bus.provision()
    bus.send(PlaceOrder(order_id="a", amount=-1))
    bus.send(PlaceOrder(order_id="b", amount=1))
    bus.storage.queues.send(bus.names.queue("desk"), base64.b64encode(b"{not json").decode())
    drain(bus, fail_fast=False)

    by_outcome: dict[tuple[str, str], int] = {}
    for span in recorded.named("process desk"):
        assert span.attributes is not None
        key = (str(span.attributes["eobus.outcome"]), str(span.attributes.get("error.type")))
        by_outcome[key] = by_outcome.get(key, 0) + 1
        if "error.type" in span.attributes:
            assert span.status.status_code is StatusCode.ERROR
        if span.attributes.get("error.type") == "KeyError":  # the handler's exception, recorded
            [event] = span.events
            assert event.attributes is not None
            assert event.attributes["exception.type"] == "KeyError"
    assert by_outcome == {("poisoned", "bus.retry.Reject"): 1,
                          ("retry", "KeyError"): 1, ("poisoned", "KeyError"): 1,
                          ("poisoned", "eobus.invalid_message"): 1}
    consumed = recorded.points("messaging.client.consumed.messages")
    counts = {(a["eobus.outcome"], a.get("error.type")): v for a, v in consumed}
    assert counts == {("poisoned", "bus.retry.Reject"): 1, ("retry", "KeyError"): 1,
                      ("poisoned", "KeyError"): 1, ("poisoned", "eobus.invalid_message"): 1}


def test_metrics_count_sends_consumes_and_time(storage: Storage, prefix: str,
                                               recorded: Recorded) -> None:
    bus = build(storage, prefix, telemetry=Telemetry(
        meter_provider=recorded.meter_provider, storage_metrics=True))
    for order in range(3):
        bus.send(PlaceOrder(order_id=f"o{order}", amount=5))
    drain(bus)
    sent = {a["messaging.destination.name"]: v
            for a, v in recorded.points("messaging.client.sent.messages")}
    assert sent == {"orders": 3, "billing": 3, "shipping": 3}
    consumed = {(a["messaging.destination.name"], a["eobus.outcome"]): v
                for a, v in recorded.points("messaging.client.consumed.messages")}
    assert consumed == {("orders", "processed"): 3, ("billing", "processed"): 3,
                        ("shipping", "processed"): 3}
    durations = {a["messaging.destination.name"]: n
                 for a, n in recorded.points("messaging.process.duration")}
    assert durations == {"orders": 3, "billing": 3, "shipping": 3}
    end_to_end = {a["messaging.destination.name"]: n
                  for a, n in recorded.points("eobus.message.end_to_end.duration")}
    assert end_to_end == {"orders": 3, "billing": 3, "shipping": 3}
    storage_ops = {(a["eobus.storage.service"], a["eobus.storage.operation"])
                   for a, _ in recorded.points("eobus.storage.operation.duration")}
    # The protocol's requests (a host's lease and delete are its receive and settle).
    assert {("queue", "send"), ("table", "get_many"), ("table", "transact")} <= storage_ops
    operations = {a["messaging.operation.name"]
                  for a, _ in recorded.points("messaging.client.operation.duration")}
    assert operations == {"send", "receive", "settle"}  # not create: made in memory


def test_storage_requests_are_timed_only_when_asked(storage: Storage, prefix: str,
                                                    recorded: Recorded) -> None:
    bus = build(storage, prefix, telemetry=recorded.telemetry)  # storage_metrics=False
    bus.send(PlaceOrder(order_id="o1", amount=5))
    drain(bus)
    assert recorded.points("messaging.process.duration")
    assert recorded.points("eobus.storage.operation.duration") == []


def _delivered(bus: Bus, endpoint: str, trace_context: dict[str, str]) -> None:
    trigger = QueueTrigger(bus, endpoint, max_dequeue_count=5, inline_dispatch_max=None)
    [message] = bus.storage.queues.receive(bus.names.queue(endpoint), max_messages=1,
                                           lease=30)
    trigger.deliver(base64.b64decode(message.body), 1, trace_context)


INVOCATION = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize("parent", ["invocation", "message"])
def test_the_functions_trigger_s_process_span_and_the_invocation(
        storage: Storage, prefix: str, recorded: Recorded, parent: str) -> None:
    bus = build(storage, prefix, telemetry=recorded.telemetry,
                settings=Settings(process_span_parent=parent))  # type: ignore[arg-type]
    bus.send(PlaceOrder(order_id="o1", amount=5))
    _delivered(bus, "orders", {"traceparent": INVOCATION})
    send, process = recorded.one("send orders"), recorded.one("process orders")
    invocation = (int(INVOCATION.split("-")[1], 16), int(INVOCATION.split("-")[2], 16))
    parent_of = (process.parent.trace_id, process.parent.span_id) if process.parent else None
    links = [(link.context.trace_id, link.context.span_id) for link in process.links]
    creation = (send.context.trace_id, send.context.span_id)
    if parent == "invocation":  # the conventions' default
        assert parent_of == invocation and links == [creation]
    else:  # one trace end to end
        assert parent_of == creation and links == [invocation]


def test_log_records_carry_the_process_span(storage: Storage, prefix: str,
                                            recorded: Recorded) -> None:
    # The SDK's logging bridge (what azure-monitor-opentelemetry installs) stamps each record
    # with the current span: the handler's, and the bus's own poisoning warning.
    from opentelemetry.sdk._logs import LoggerProvider, LoggingHandler
    from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor

    try:
        from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter as InMemory
    except ImportError:  # its older name (the minimum-versions lock has SDK 1.30)
        from opentelemetry.sdk._logs.export import InMemoryLogExporter as InMemory
    exporter = InMemory()
    provider = LoggerProvider()
    provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))
    handler = LoggingHandler(logger_provider=provider)
    desk = Endpoint("desk")

    @desk.handles(PlaceOrder, partition=lambda m: m.order_id)
    def note(message: PlaceOrder, ctx: Context) -> None:
        logging.getLogger("desk").warning("order %s noted", message.order_id)
        if message.amount < 0:
            raise Reject("negative")

    bus = Bus(storage, [desk], prefix=prefix, telemetry=recorded.telemetry)
    bus.provision()
    logging.getLogger().addHandler(handler)
    try:
        bus.send(PlaceOrder(order_id="a", amount=1))
        bus.send(PlaceOrder(order_id="b", amount=-1))
        drain(bus, fail_fast=False)
    finally:
        logging.getLogger().removeHandler(handler)
        provider.shutdown()
    bodies: dict[tuple[int, int], list[str]] = {}
    for record in exporter.get_finished_logs():
        log = record.log_record
        bodies.setdefault((log.trace_id or 0, log.span_id or 0), []).append(str(log.body))
    by_outcome = {str(s.attributes["eobus.outcome"]): s  # type: ignore[index]
                  for s in recorded.named("process desk")}
    processed, poisoned = by_outcome["processed"], by_outcome["poisoned"]
    assert bodies[(processed.context.trace_id, processed.context.span_id)] == [
        "order a noted"]
    noted, warned = bodies[(poisoned.context.trace_id, poisoned.context.span_id)]
    assert noted == "order b noted" and warned.startswith("poisoned ")


def test_no_secret_reaches_a_span(azurite_connection: str, prefix: str,
                                  recorded: Recorded) -> None:
    from bus.adapters.azure import AzureStorage

    bus = build(AzureStorage.from_connection_string(azurite_connection), prefix,
                telemetry=recorded.telemetry)
    bus.send(PlaceOrder(order_id="o1", amount=5, note="card 4111-1111"),
             headers={"authorization": "Bearer s3cr3t"})
    drain(bus)
    key = azurite_connection.split("AccountKey=")[1].split(";", maxsplit=1)[0]
    for span in recorded.spans():
        text = repr(dict(span.attributes or {})) + repr([e.attributes for e in span.events])
        for secret in (key, "s3cr3t", "4111-1111"):
            assert secret not in text, (span.name, secret)


def test_queue_depth_is_read_once_per_interval(storage: Storage, prefix: str,
                                               recorded: Recorded) -> None:
    from bus.hosting.worker import Worker
    from bus.testing import counting_storage

    counted, counter = counting_storage(storage)
    now = [1000.0]
    bus = build(counted, prefix, telemetry=recorded.telemetry,
                settings=Settings(queue_depth_seconds=60))
    bus.parts.clock = lambda: now[0]
    for order in range(3):
        bus.send(PlaceOrder(order_id=f"o{order}", amount=5))
    workers = [Worker(bus, "orders"), Worker(bus, "orders"), Worker(bus, "billing")]
    # Another bus of the process, reporting to the same provider, with a queue of its own.
    other = Bus(counted, [Endpoint("audit")], prefix=prefix + "x",
                telemetry=Telemetry(meter_provider=recorded.meter_provider))
    other.provision()
    other.parts.clock = lambda: now[0]
    workers.append(Worker(other, "audit"))
    counter.reset()

    def depths() -> dict[object, object]:
        return {a["messaging.destination.name"]: v
                for a, v in recorded.points("eobus.queue.depth")}

    assert depths() == {"orders": 3, "billing": 0, "audit": 0}
    assert depths() == {"orders": 3, "billing": 0, "audit": 0}  # the same readings again
    assert counter.snapshot() == {("queue", "depth"): 3}  # one per queue, not per worker
    workers[0].poll_once()
    assert depths()["orders"] == 3  # within the interval: the last reading
    now[0] += 60
    assert depths()["orders"] == 0
    assert counter.snapshot()[("queue", "depth")] == 6
    del workers


def test_a_spark_read_links_to_the_messages_it_takes(storage: Storage, prefix: str,
                                                     recorded: Recorded) -> None:
    from bus.integrations.spark.reader import Drainer, staged_rows, subscribe
    from bus.integrations.spark.staging import Staging

    bus = Bus(storage, routes={PlaceOrder: "sink"}, prefix=prefix,
              telemetry=recorded.telemetry)
    Staging(storage, prefix).ensure()
    subscribe(bus, "sink")
    for order in ("a", "b"):
        bus.send(PlaceOrder(order_id=order, amount=1))
    drainer = Drainer(bus, Staging(storage, prefix), "sink")
    assert drainer.stage("r~sink~a", 10, close_empty=True) == 2
    sends = recorded.named("send sink")
    [receive] = recorded.named("receive sink")
    assert {link.context.span_id for link in receive.links} == {
        s.context.span_id for s in sends}
    # The rows keep the headers: a pipeline can continue the trace from them.
    rows = staged_rows(Staging(storage, prefix), "r~sink~a", None)
    headers = [row[7] for row in rows]  # the "headers" column (columns.BASE_COLUMNS)
    assert sorted(h["traceparent"].split("-")[2] for h in headers) == sorted(
        f"{s.context.span_id:016x}" for s in sends)


def test_a_spark_write_job_carries_the_driver_s_trace_to_its_tasks(recorded: Recorded) -> None:
    import pickle

    from bus.integrations.spark.options import Connection, WriteOptions
    from bus.integrations.spark.writer import JobWriter

    options = WriteOptions(Connection(connection_string="UseDevelopmentStorage=true"),
                           "tests.integrations.spark.contracts:RecordSale", destination="sink",
                           key_columns=("sale_id",))
    with recorded.telemetry.tracer.start_as_current_span("nightly job") as driver:
        job = JobWriter(options)
    shipped = pickle.loads(pickle.dumps(job))  # as Spark ships it to the executors
    _, trace_id, span_id, _ = shipped.trace["traceparent"].split("-")
    assert (trace_id, span_id) == (f"{driver.get_span_context().trace_id:032x}",
                                   f"{driver.get_span_context().span_id:016x}")
    assert JobWriter(options).trace == {}  # no span on the driver: nothing to continue


def test_an_earlier_record_completed_by_a_later_claim_is_under_its_span(
        storage: Storage, prefix: str, recorded: Recorded) -> None:
    bus = build(storage, prefix, telemetry=recorded.telemetry)
    bus.send(PlaceOrder(order_id="o1", amount=5))
    [first] = bus.storage.queues.receive(bus.names.queue("orders"), max_messages=1, lease=30)
    [handed] = bus.parts.receiver("orders").receive([Incoming(first.body, 1)], inline_max=0)
    assert isinstance(handed, Delivery) and handed.handoff is not None  # left in the slot
    later = bus.send(PlaceOrder(order_id="o1", amount=7))  # the same partition
    drain(bus, ["orders"])  # its claim completes the first record, then handles its own
    [second] = [s for s in recorded.named("process orders")
                if s.attributes and s.attributes["messaging.message.id"] == later]
    sends = [s for s in recorded.spans() if s.name == "send" and s.kind is SpanKind.CLIENT]
    assert len(sends) == 2  # the first record's signals, then the second's
    assert {_parent(s) for s in sends} == {second.context.span_id}
