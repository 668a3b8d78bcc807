"""The devhost: settings, indexing, and the listeners of one function app."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from azure.functions.meta import Datum
from azure.functions.timer import TimerRequestConverter
from azure.storage.queue import QueueServiceClient

from devhost.durable import DurableApi, DurableRuntime
from devhost.loader import AppIndex, Function, load_app
from devhost.queues import QueueListener, QueueOptions

log = logging.getLogger("devhost")


def load_local_settings(script_root: Path) -> dict[str, str]:
    """``local.settings.json`` Values, as ``func start`` applies them (the environment wins)."""
    path = script_root / "local.settings.json"
    if not path.exists():
        return {}
    values = json.loads(path.read_text()).get("Values", {})
    return {k: str(v) for k, v in values.items()}


def queue_options(host_json: dict[str, Any]) -> QueueOptions:
    queues = host_json.get("extensions", {}).get("queues", {})
    return QueueOptions(
        batch_size=queues.get("batchSize", 16),
        new_batch_threshold=queues.get("newBatchThreshold"),
        max_polling_interval=_timespan(queues.get("maxPollingInterval", "00:01:00")),
        visibility_timeout=_timespan(queues.get("visibilityTimeout", "00:00:00")),
        max_dequeue_count=queues.get("maxDequeueCount", 5),
        message_encoding=queues.get("messageEncoding", "base64"))


def hub_name(host_json: dict[str, Any]) -> str:
    """The Durable task hub of the app (host.json ``durableTask.hubName``)."""
    return str(host_json.get("extensions", {}).get("durableTask", {}).get("hubName", "devhost"))


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
    index: AppIndex
    connection_strings: dict[str, str]
    options: QueueOptions
    hub: str
    timer_seconds: float | None = None
    listeners: list[QueueListener] = field(default_factory=list)
    runtime: DurableRuntime | None = None
    api: DurableApi | None = None
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    @classmethod
    def create(cls, script_root: Path, *, timer_seconds: float | None = None,
               lease_seconds: float | None = None) -> Host:
        for key, value in load_local_settings(script_root).items():
            os.environ.setdefault(key, value)
        os.environ.setdefault("AzureWebJobsScriptRoot", str(script_root))
        host_json = json.loads((script_root / "host.json").read_text())
        index = load_app(script_root)
        hub = hub_name(host_json)
        connections = {name: _connection(name) for name in _connection_names(index)}
        options = queue_options(host_json)
        if lease_seconds is not None:
            options = replace(options, lease_seconds=lease_seconds)
        return cls(script_root, index, connections, options, hub, timer_seconds)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(max_workers=64))
        tasks = []
        if self.index.of_type("orchestrationTrigger"):
            # Work items of a killed host come back after this lease (no renewal: a longer
            # episode is fenced by the instance's ETag instead).
            self.runtime = DurableRuntime(
                self.index, self.connection_strings["AzureWebJobsStorage"], self.hub,
                lease_seconds=min(120.0, max(10.0, 2 * self.options.lease_seconds)))
            await asyncio.to_thread(self.runtime.provision)
            self.api = DurableApi(self.runtime)
            await self.api.start()
            tasks.append(self.runtime.run(self.stop))
        for function in self.index.of_type("queueTrigger"):
            service = QueueServiceClient.from_connection_string(
                self.connection_strings[function.trigger.get("connection",
                                                             "AzureWebJobsStorage")])
            listener = QueueListener(function, service, self.options,
                                     self._extra_args(function))
            self.listeners.append(listener)
            tasks.append(listener.run(self.stop))
        for function in self.index.of_type("timerTrigger"):
            tasks.append(self._timer(function))
        log.info("devhost: %d queue triggers, %d orchestrators, %d activities, %d timers",
                 len(self.listeners), len(self.index.of_type("orchestrationTrigger")),
                 len(self.index.of_type("activityTrigger")),
                 len(self.index.of_type("timerTrigger")))
        try:
            await asyncio.gather(*tasks)
        finally:
            if self.api is not None:
                await self.api.stop()
            await _close_durable_client_session()

    def stats(self) -> dict[str, Any]:
        """Invocation counters per queue-triggered function, and the Durable runtime's."""
        return {"functions": {listener.function.name: asdict(listener.counters)
                              for listener in self.listeners},
                "durable": dict(self.runtime.stats) if self.runtime else {}}

    def _extra_args(self, function: Function) -> dict[str, Any]:
        args: dict[str, Any] = {}
        for binding in function.bindings:
            if binding["type"] == "durableClient":
                assert self.api is not None, "a durableClient binding needs an orchestrator"
                args[binding["name"]] = self.api.client_binding()
        return args

    async def _timer(self, function: Function) -> None:
        interval = self.timer_seconds or timer_interval(function.trigger["schedule"])
        while not self.stop.is_set():
            try:
                await asyncio.wait_for(self.stop.wait(), timeout=interval)
                return
            except asyncio.TimeoutError:
                pass
            try:
                await _invoke_timer(function, past_due=False)
            except Exception:
                log.exception("timer function %s failed", function.name)


async def _invoke_timer(function: Function, *, past_due: bool) -> None:
    # The same conversion the worker applies to the host's timer payload.
    payload = json.dumps({"IsPastDue": past_due, "ScheduleStatus": {}, "Schedule": {}})
    request = TimerRequestConverter.decode(Datum(value=payload, type="json"),
                                           trigger_metadata=None)
    kwargs = {function.trigger["name"]: request}
    if function.is_async:
        await function.user_function(**kwargs)
    else:
        await asyncio.to_thread(function.user_function, **kwargs)


def _connection_names(index: AppIndex) -> set[str]:
    names = {"AzureWebJobsStorage"}
    for function in index.of_type("queueTrigger"):
        names.add(function.trigger.get("connection", "AzureWebJobsStorage"))
    return names


def _connection(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise SystemExit(f"devhost: app setting {name!r} is missing; put a connection string "
                         "in local.settings.json (Values) or the environment")
    return value


async def _close_durable_client_session() -> None:
    # DurableOrchestrationClient keeps one aiohttp session per process (module global); the
    # worker never closes it, but a clean exit here avoids "unclosed session" noise.
    from azure.durable_functions.models.utils import http_utils

    await http_utils._close_session()
