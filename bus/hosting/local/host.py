"""The local host: settings, the worker, and the listeners of one function app."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from bus.hosting.local import bindings
from bus.hosting.local.appsettings import load_local_settings, resolve
from bus.hosting.local.durable import DurableApi, DurableRuntime
from bus.hosting.local.hostio import Connection
from bus.hosting.local.queues import (
    Activity,
    QueueListener,
    QueueOptions,
    all_idle,
    extra_inputs_for,
    sleep_or_stop,
)
from bus.hosting.local.worker import (
    AppIndex,
    Function,
    IndexingError,
    InvocationFailed,
    Worker,
    worker_version,
)

log = logging.getLogger("bus.hosting.local")


IDLE_LIMIT_SECONDS = 600.0
"""How long ``until_idle`` waits for the app to go idle before it stops anyway."""

DEFAULT_FUNCTION_TIMEOUT = "00:30:00"
"""The host's ``functionTimeout`` when host.json has none (ScriptJobHostOptionsSetup; Flex
Consumption and dedicated plans; -1 means no limit)."""


def queue_options(host_json: dict[str, Any]) -> QueueOptions:
    queues = host_json.get("extensions", {}).get("queues", {})
    timeout = str(host_json.get("functionTimeout", DEFAULT_FUNCTION_TIMEOUT))
    return QueueOptions(
        function_timeout=None if timeout == "-1" else _timespan(timeout),
        batch_size=queues.get("batchSize", 16),
        new_batch_threshold=queues.get("newBatchThreshold"),
        max_polling_interval=_timespan(queues.get("maxPollingInterval", "00:01:00")),
        visibility_timeout=_timespan(queues.get("visibilityTimeout", "00:00:00")),
        max_dequeue_count=queues.get("maxDequeueCount", 5),
        message_encoding=queues.get("messageEncoding", "base64"))


def hub_name(host_json: dict[str, Any], environ: Mapping[str, str] | None = None) -> str:
    """The Durable task hub of the app (host.json ``durableTask.hubName``; ``%NAME%`` is an
    app setting, resolved as the host resolves it)."""
    raw = str(host_json.get("extensions", {}).get("durableTask", {}).get("hubName", "devhost"))
    return resolve(raw, environ)


def _timespan(text: str) -> float:
    hours, minutes, seconds = text.split(":")
    return int(hours) * 3600 + int(minutes) * 60 + float(seconds)


def timer_interval(schedule: str) -> float:
    """Seconds between runs of an NCRONTAB schedule of the ``*/N`` kind; 300 otherwise."""
    fields = schedule.split()
    if len(fields) == 6:
        for position, unit in ((0, 1), (1, 60), (2, 3600)):
            match = re.fullmatch(r"\*/(\d+)", fields[position])
            if match:
                return int(match.group(1)) * unit
    return 300.0


@dataclass
class Host:
    script_root: Path
    options: QueueOptions
    host_json: dict[str, Any]
    timer_seconds: float | None = None
    worker: Worker = field(init=False)
    index: AppIndex = field(default_factory=AppIndex)
    listeners: list[QueueListener] = field(default_factory=list)
    runtime: DurableRuntime | None = None
    api: DurableApi | None = None
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    until_idle: bool = False
    """Stop once nothing is left to do (``_stop_when_idle``) instead of at SIGTERM or Ctrl-C."""
    still_busy: bool = False
    """Set when ``until_idle`` gave up: the app never went idle (``IDLE_LIMIT_SECONDS``)."""
    _timers: Activity = field(default_factory=Activity, init=False)

    def __post_init__(self) -> None:
        self.worker = Worker(self.script_root)

    @classmethod
    def create(cls, script_root: Path, *, timer_seconds: float | None = None,
               lease_seconds: float | None = None, until_idle: bool = False) -> Host:
        for key, value in load_local_settings(script_root).items():
            os.environ.setdefault(key, value)
        os.environ.setdefault("AzureWebJobsScriptRoot", str(script_root))
        host_json = json.loads((script_root / "host.json").read_text())
        options = queue_options(host_json)
        if lease_seconds is not None:
            options = replace(options, lease_seconds=lease_seconds)
        return cls(script_root, options, host_json, timer_seconds, until_idle=until_idle)

    async def run(self) -> None:
        try:
            self.index = await self.worker.start()
        except IndexingError as exc:
            raise SystemExit(f"local host: no function loaded - {exc}") from exc
        connections = {name: Connection.from_settings(name, os.environ)
                       for name in _connection_names(self.index)}
        try:
            await self._listen(connections)
        finally:
            if self.api is not None:
                await self.api.stop()
            await _close_durable_client_session()
            self.worker.stop()

    async def _listen(self, connections: dict[str, Connection]) -> None:
        tasks = []
        if self.index.of_type("orchestrationTrigger"):
            # Work items of a killed host come back after this lease (no renewal: a longer
            # episode is fenced by the instance's ETag instead).
            self.runtime = DurableRuntime(
                self.index, self.worker, connections["AzureWebJobsStorage"],
                hub_name(self.host_json),
                lease_seconds=min(120.0, max(10.0, 2 * self.options.lease_seconds)))
            self.runtime.provision()
            self.api = DurableApi(self.runtime)
            await self.api.start()
            tasks.append(self.runtime.run(self.stop))
        client = self.api.client_binding() if self.api else None
        for function in self.index.of_type("queueTrigger"):
            service = connections[_connection_name(function)].queue_service()
            listener = QueueListener(function, self.worker, service, self.options,
                                     extra_inputs_for(function, client))
            self.listeners.append(listener)
            tasks.append(listener.run(self.stop))
        tasks.extend(self._timer(function) for function in self.index.of_type("timerTrigger"))
        if self.until_idle:
            tasks.append(self._stop_when_idle())
        log.info("local host: %s loaded %d functions (%d queue triggers, %d orchestrators, "
                 "%d activities, %d timers); %d threads for sync functions",
                 worker_version(), len(self.index.functions), len(self.listeners),
                 len(self.index.of_type("orchestrationTrigger")),
                 len(self.index.of_type("activityTrigger")),
                 len(self.index.of_type("timerTrigger")), self.worker.threads)
        await asyncio.gather(*tasks)

    def stats(self) -> dict[str, Any]:
        """The worker, the functions it loaded, invocation counters per queue-triggered
        function, and the Durable runtime's."""
        return {"worker": worker_version(), "functions_loaded": len(self.index.functions),
                "worker_threads": self.worker.threads,
                "functions": {listener.function.name: asdict(listener.counters)
                              for listener in self.listeners},
                "durable": dict(self.runtime.stats) if self.runtime else {}}

    async def _timer(self, function: Function) -> None:
        interval = self.timer_seconds or timer_interval(function.trigger["schedule"])
        while not self.stop.is_set():
            try:
                await asyncio.wait_for(self.stop.wait(), timeout=interval)
                return
            except asyncio.TimeoutError:
                pass
            await self._tick(function)

    async def _tick(self, function: Function) -> None:
        self._timers.begin()
        try:
            await self.worker.invoke(function, {str(function.trigger["name"]):
                                                bindings.timer_trigger(past_due=False)})
        except InvocationFailed as exc:
            log.error("timer function %s failed: %s", function.name, exc)
        finally:
            self._timers.end()

    async def _stop_when_idle(self) -> None:
        """``until_idle``: wait until every queue trigger and orchestration worker is idle
        (``queues.all_idle``), run each timer function once (the bus's maintenance: what it
        sends is handled too), wait until idle again, and stop. Messages that are not due
        yet (a retry delay, a scheduled send) are not waited for. Gives up after
        ``IDLE_LIMIT_SECONDS`` of work that keeps coming."""
        activities = [listener.activity for listener in self.listeners]
        activities += self.runtime.activities if self.runtime else []
        deadline = time.monotonic() + IDLE_LIMIT_SECONDS
        for ticks in (True, False):
            while self._timers.busy or not all_idle(activities, self._timers.done_at):
                if time.monotonic() > deadline:
                    self.still_busy = True
                    self.stop.set()
                    return
                await sleep_or_stop(self.stop, 0.2)
                if self.stop.is_set():
                    return
            if ticks:
                for function in self.index.of_type("timerTrigger"):
                    await self._tick(function)
        self.stop.set()


def _connection_names(index: AppIndex) -> set[str]:
    return {"AzureWebJobsStorage"} | {_connection_name(f) for f in index.of_type("queueTrigger")}


def _connection_name(function: Function) -> str:
    return str(function.trigger.get("connection") or "AzureWebJobsStorage")


async def _close_durable_client_session() -> None:
    # DurableOrchestrationClient keeps one aiohttp session per process (module global); the
    # worker never closes it, but a clean exit here avoids "unclosed session" noise.
    from azure.durable_functions.models.utils import http_utils

    await http_utils._close_session()
