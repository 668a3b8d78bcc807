"""The bus as a Functions app blueprint: one queue trigger per endpoint, the outbox orchestration
and its activities, and a maintenance timer - registered by one call::

    app = df.DFApp(http_auth_level=func.AuthLevel.FUNCTION)
    app.register_functions(BusFunctions([orders, billing, shipping]))

Settings are read and checked here, at indexing time, so a misconfigured app fails at start-up.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections.abc import Generator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypedDict

import azure.durable_functions as df
import azure.functions as func

from bus.bus import Bus
from bus.coroutines import handed_off_from
from bus.endpoint import Endpoint
from bus.errors import ConfigurationError
from bus.hosting.functions.config import AppConfig
from bus.hosting.functions.trigger import QueueTrigger
from bus.hosting.maintenance import maintenance_pass
from bus.messages import Message
from bus.observability import Telemetry
from bus.observability.depth import QueueDepths
from bus.protocol.delivery import Delivery, Handoff
from bus.protocol.records import RecordKey
from bus.settings import Settings
from bus.storage import QueueMessage
from bus.topology import Readers

log = logging.getLogger(__name__)

ORCHESTRATOR = "bus_outbox"
PREPARE, SIGNAL, FINISH = "bus_outbox_prepare", "bus_outbox_signal", "bus_outbox_finish"
MAINTENANCE = "bus_maintenance"
SIGNAL_BATCH = 16
"""Copies signalled per activity call: activities of one fan-out run in parallel."""
MAINTENANCE_SCHEDULE = "0 */5 * * * *"
RETRY = df.RetryOptions(first_retry_interval_in_milliseconds=1000, max_number_of_attempts=5)
_INSTANCE_NAMESPACE = uuid.UUID("0f9e6b1e-5d0c-4d43-9a57-6c1f1b0f7a10")
_RUNNING = {df.OrchestrationRuntimeStatus.Running, df.OrchestrationRuntimeStatus.Pending}


class OutboxJob(TypedDict, total=False):
    """An outbox activity's input: which record (and, for ``signal``, which copies).

    A class, not ``dict[str, Any]``: the Python worker refuses a parameter whose annotation is
    neither a class nor a ``typing`` generic, and a refused function keeps the whole app from
    loading (tests/hosting/functions/test_real_worker.py loads every function through the worker).
    """

    endpoint: str
    partition: str
    message_id: str
    attempt_id: str
    """The incoming copy the record was committed for (absent in jobs started before it was
    carried: such a job names its record by message id alone)."""
    generation: int
    indexes: list[int]
    trace: dict[str, str]
    """The trace context (W3C headers) of the process span that handed the record off: the
    activities' sends belong to that trace."""


def job_for(handoff: Handoff) -> OutboxJob:
    """The orchestration's input for ``handoff``'s record."""
    key = handoff.key
    return {"endpoint": handoff.endpoint, "partition": key.partition,
            "message_id": key.message_id, "attempt_id": key.attempt_id or "",
            "generation": key.generation, "trace": dict(handoff.trace)}


def record_key(job: OutboxJob) -> RecordKey:
    """Which record an activity acts on."""
    return RecordKey(job["partition"], job["message_id"], job.get("attempt_id") or None,
                     job.get("generation", 0))


def invocation_trace(context: func.Context | None) -> dict[str, str]:
    """The invocation's trace context as W3C headers (empty when the host sent none)."""
    trace = getattr(context, "trace_context", None)
    parent = getattr(trace, "trace_parent", "") or ""
    if not parent:
        return {}
    state = getattr(trace, "trace_state", "") or ""
    return {"traceparent": parent, **({"tracestate": state} if state else {})}


def trigger_function_name(endpoint: str) -> str:
    return "bus_endpoint_" + endpoint.replace("-", "_")


def instance_id(handoff: Handoff) -> str:
    """The orchestration instance id of one committed record: deterministic, so a redelivery
    that hands the same record off again finds the running instance - and a later record of
    the same message id in the same slot gets an instance of its own."""
    key = handoff.key
    name = (f"{handoff.endpoint}\n{key.partition}\n{key.message_id}\n{key.attempt_id}\n"
            f"{key.generation}")
    return f"bus-{uuid.uuid5(_INSTANCE_NAMESPACE, name)}"


class BusFunctions(df.Blueprint):  # type: ignore[misc]
    """Every function the bus needs, for ``app.register_functions``.

    ``bus`` is the configured Bus (for provisioning and client sends from the same settings).
    ``readers``: endpoints hosted elsewhere (Spark jobs) and the topics each subscribes to; the
    app provisions and subscribes them, and does not host them. ``telemetry``: where spans and
    metrics go (``bus.observability``; by default the global providers, which the Python
    worker's Application Insights distro installs).
    """

    def __init__(self, endpoints: Sequence[Endpoint], *,
                 routes: Mapping[type[Message] | str, str] | None = None,
                 settings: Settings | None = None, environ: Mapping[str, str] | None = None,
                 host_json: Path | None = None, readers: Readers | None = None,
                 telemetry: Telemetry | None = None) -> None:
        super().__init__()
        # App settings win over the settings given in code (``AppConfig.settings``).
        self.config = AppConfig.from_environment(environ, host_json, settings=settings)
        settings = self.config.settings
        self.bus = Bus(self.config.storage(), endpoints, prefix=self.config.prefix,
                       routes=routes, settings=settings, readers=readers, telemetry=telemetry)
        # BUS_DELIVERY_THREADS: None runs deliveries on the event loop's default executor.
        threads = self.config.delivery_threads
        self.delivery_executor = (
            ThreadPoolExecutor(threads, thread_name_prefix="bus-delivery") if threads else None)
        hosted = self.config.hosted_endpoints(list(self.bus.topology.endpoints))
        for name in hosted:
            if not self.bus.topology.endpoint(name).routes:
                raise ConfigurationError(f"endpoint {name!r} has no handler: add one with "
                                         f"@{name}.handles(...) or leave it out")
            self._add_endpoint(name)
        self.depths = QueueDepths(self.bus.storage.queues,
                                  {name: self.bus.names.queue(name) for name in hosted},
                                  settings.queue_depth_seconds, self.bus.parts.clock)
        self.bus.parts.telemetry.watch_depths(self.depths)  # eobus.queue.depth
        self._add_outbox_orchestration()
        self._add_maintenance()
        self._hosted = hosted
        self._beating = False
        self._beating_lock = threading.Lock()

    # -- endpoints ------------------------------------------------------------------------
    def _add_endpoint(self, endpoint: str) -> None:
        trigger = QueueTrigger(self.bus, endpoint,
                               max_dequeue_count=self.config.max_dequeue_count,
                               inline_dispatch_max=self.config.inline_dispatch_max)
        executor = self.delivery_executor

        def deliver(loop: asyncio.AbstractEventLoop, msg: func.QueueMessage,
                    trace: Mapping[str, str] | None) -> Delivery:
            self._beat()
            with handed_off_from(loop):  # async handlers run on the worker's event loop
                return trigger.deliver(msg.get_body(), msg.dequeue_count or 1, trace,
                                       lease=lease_of(msg))

        async def run(msg: func.QueueMessage, client: df.DurableOrchestrationClient,
                      context: func.Context) -> None:
            loop = asyncio.get_running_loop()
            delivery = await loop.run_in_executor(
                executor, deliver, loop, msg, invocation_trace(context))
            for handoff in delivery.handoffs:  # a bundle's signals may leave several
                await start_dispatch(client, handoff)

        run.__name__ = run.__qualname__ = trigger_function_name(endpoint)
        decorated = self.function_name(trigger_function_name(endpoint))(
            self.queue_trigger(arg_name="msg", queue_name=self.bus.names.queue(endpoint),
                               connection=self.config.connection)(
                self.durable_client_input(client_name="client")(run)))
        assert decorated is not None

    def _beat(self) -> None:
        """From this instance's first invocation on, its heartbeat names the hosted endpoints
        (``bus.observability.heartbeat``). Not at import: the command line imports the app too."""
        if self._beating:
            return
        with self._beating_lock:
            if self._beating:
                return
            self._beating = True
        heartbeat = self.bus.parts.heartbeat("functions")
        if heartbeat is not None:
            heartbeat.serve(self._hosted)

    # -- outbox fan-out -------------------------------------------------------------------
    def _add_outbox_orchestration(self) -> None:
        bus = self.bus

        def bus_outbox(context: df.DurableOrchestrationContext) -> Generator[Any, Any, str]:
            job = context.get_input()
            copies = yield context.call_activity_with_retry(PREPARE, RETRY, job)
            if copies is None:
                return "finished elsewhere"
            batches = [list(range(i, min(i + SIGNAL_BATCH, copies)))
                       for i in range(0, copies, SIGNAL_BATCH)]
            yield context.task_all([
                context.call_activity_with_retry(SIGNAL, RETRY, {**job, "indexes": batch})
                for batch in batches])
            finished = yield context.call_activity_with_retry(FINISH, RETRY, job)
            return "dispatched" if finished else "finished elsewhere"

        # Each activity in the trace of the handler run that committed the record.
        def bus_outbox_prepare(job: OutboxJob) -> int | None:
            with bus.parts.telemetry.continued(job.get("trace")):
                return bus.parts.outbox_driver(job["endpoint"]).prepare(record_key(job))

        def bus_outbox_signal(job: OutboxJob) -> int:
            with bus.parts.telemetry.continued(job.get("trace")):
                return bus.parts.outbox_driver(job["endpoint"]).signal(record_key(job),
                                                                 job["indexes"])

        def bus_outbox_finish(job: OutboxJob) -> bool:
            with bus.parts.telemetry.continued(job.get("trace")):
                return bus.parts.outbox_driver(job["endpoint"]).finish(record_key(job))

        self.orchestration_trigger(context_name="context", orchestration=ORCHESTRATOR)(
            bus_outbox)
        for name, activity in ((PREPARE, bus_outbox_prepare), (SIGNAL, bus_outbox_signal),
                               (FINISH, bus_outbox_finish)):
            self.activity_trigger(input_name="job", activity=name)(activity)

    # -- maintenance ----------------------------------------------------------------------
    def _add_maintenance(self) -> None:
        bus, stalled = self.bus, self.config.stalled_outbox_seconds

        def bus_maintenance(timer: func.TimerRequest) -> None:
            log.info("bus maintenance: %s", maintenance_pass(bus, stalled))

        self.timer_trigger(schedule=MAINTENANCE_SCHEDULE, arg_name="timer")(bus_maintenance)


def lease_of(msg: func.QueueMessage) -> QueueMessage | None:
    """The host's lease on a triggering message (its id and pop receipt, from the trigger's
    metadata), with which the trigger postpones a failed handler's retry; None when the host
    gave neither."""
    if not (msg.id and msg.pop_receipt):
        return None
    return QueueMessage(msg.id, msg.pop_receipt, "", msg.dequeue_count or 1)


async def start_dispatch(client: df.DurableOrchestrationClient, handoff: Handoff) -> None:
    """Start the orchestration that dispatches ``handoff``'s record.

    ``start_new`` with an existing id re-runs a finished instance (harmless: its activities see
    the record gone) and raises for a running one (fine: it is dispatching this record).
    Anything else raises, the message is redelivered, and the redelivery finishes the record
    inline - it is still in the slot.
    """
    instance = instance_id(handoff)
    job = job_for(handoff)
    try:
        await client.start_new(ORCHESTRATOR, instance, job)
    except Exception:
        status = await client.get_status(instance)
        if status.runtime_status in _RUNNING:
            log.info("dispatch %s is already running", instance)
            return
        raise
