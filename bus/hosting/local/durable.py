"""Durable Functions without the host: instances, history and the replay loop.

The orchestrator code runs in the real azure-functions-durable replay engine, invoked through
Microsoft's worker (``bus.hosting.local.worker``) like every other function: for every
episode we send it the whole history (OrchestratorStarted, ExecutionStarted,
TaskScheduled, TaskCompleted/TaskFailed, TimerCreated/TimerFired ...) exactly as the Durable
extension does, and read back the actions it wants. Activities run at least once (an instance
resumed after a crash re-runs those without a recorded result) and retries follow
``call_activity_with_retry``'s contract: failure, timer, rescheduled task, with one extra timer
after the last attempt (the SDK waits for it).

Instances live in blobs (one JSON document each, updated with ETag compare-and-swap) and work
items on a queue, so a killed local host resumes where it stopped. The client side is the real
DurableOrchestrationClient, talking HTTP to ``DurableApi`` (the subset of the extension's
webhook API it uses: start, status).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from aiohttp import web
from azure.core import MatchConditions
from azure.core.exceptions import HttpResponseError, ResourceExistsError, ResourceNotFoundError
from azure.storage.blob import BlobServiceClient
from azure.storage.queue import QueueMessage

from bus.hosting.local import bindings
from bus.hosting.local.hostio import Connection, host_io
from bus.hosting.local.queues import Activity, sleep_or_stop
from bus.hosting.local.worker import AppIndex, Function, InvocationFailed, Worker

log = logging.getLogger("bus.hosting.local.durable")

# HistoryEventType values of the Durable protocol (azure.durable_functions.models.history).
EXECUTION_STARTED, EXECUTION_COMPLETED, EXECUTION_FAILED = 0, 1, 2
TASK_SCHEDULED, TASK_COMPLETED, TASK_FAILED = 4, 5, 6
TIMER_CREATED, TIMER_FIRED = 10, 11
ORCHESTRATOR_STARTED, ORCHESTRATOR_COMPLETED = 12, 13
CALL_ACTIVITY, CALL_ACTIVITY_WITH_RETRY = 0, 1
RUNNING = ("Pending", "Running")


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat()


@dataclass
class Instance:
    """One orchestration instance: what the Durable extension keeps in its history table."""

    id: str
    name: str
    input: str | None
    status: str = "Pending"
    history: list[dict[str, Any]] = field(default_factory=list)
    next_id: int = 0
    actions_seen: int = 0
    open: dict[str, dict[str, Any]] = field(default_factory=dict)
    output: Any = None
    error: str | None = None
    created: str = field(default_factory=_now)
    updated: str = field(default_factory=_now)

    def event(self, event_type: int, event_id: int = -1, **fields: Any) -> None:
        self.history.append({"EventType": event_type, "EventId": event_id, "IsPlayed": False,
                             "Timestamp": _now(), **fields})

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def status_json(self) -> dict[str, Any]:
        return {"name": self.name, "instanceId": self.id, "runtimeStatus": self.status,
                "input": self.input, "output": self.output, "createdTime": self.created,
                "lastUpdatedTime": self.updated, "customStatus": None}


def work_queue_name(hub: str) -> str:
    """The queue of orchestration work items (one message per instance to drive)."""
    return f"{hub.lower()}-devhost-work"


class InstanceStore:
    """Instances as blobs; every save is a compare-and-swap on the blob's ETag."""

    def __init__(self, blobs: BlobServiceClient, container: str) -> None:
        self._container = blobs.get_container_client(container)

    def create_container(self) -> None:
        with contextlib.suppress(ResourceExistsError):
            self._container.create_container()

    def load(self, instance_id: str) -> tuple[Instance, str] | None:
        try:
            download = self._container.download_blob(f"{instance_id}.json")
        except ResourceNotFoundError:
            return None
        data = json.loads(download.readall())
        return Instance(**data), str(download.properties.etag)

    def save(self, instance: Instance, etag: str | None) -> str:
        """Write ``instance``; ``etag`` None means create-only. Raises on a lost race."""
        instance.updated = _now()
        blob = self._container.get_blob_client(f"{instance.id}.json")
        body = json.dumps(asdict(instance))
        if etag is None:
            result = blob.upload_blob(body, overwrite=False)
        else:
            result = blob.upload_blob(body, overwrite=True, etag=etag,
                                      match_condition=MatchConditions.IfNotModified)
        return str(result["etag"])


class LostInstance(Exception):
    """Someone else saved the instance since we loaded it; they own it now."""


class DurableRuntime:
    """Runs orchestrations of one app: the work queue, episodes, activities, retries."""

    def __init__(self, index: AppIndex, worker: Worker, connection: Connection, hub: str, *,
                 workers: int = 8, lease_seconds: float = 120.0) -> None:
        self.index = index
        self.worker = worker
        self.hub = hub
        base = hub.lower()
        self.store = InstanceStore(connection.blob_service(),
                                   f"{base}-devhost-instances")
        self.work = connection.queue_service().get_queue_client(work_queue_name(hub))
        self.workers = workers
        self.activities = [Activity() for _ in range(workers)]
        self.lease_seconds = lease_seconds
        self.stats = {"started": 0, "completed": 0, "failed": 0, "activities": 0,
                      "activity_failures": 0, "episodes": 0}

    def provision(self) -> None:
        self.store.create_container()
        with contextlib.suppress(ResourceExistsError):
            self.work.create_queue()

    # -- client side (called by the HTTP API) -------------------------------------------------
    def start(self, name: str, instance_id: str, input_json: str | None) -> tuple[int, Any]:
        self._orchestrator(name)  # 400 below when unknown
        current = self.store.load(instance_id)
        if current is not None and current[0].status in RUNNING:
            return 409, {"Message": f"An Orchestration instance with the status "
                                    f"{current[0].status} already exists."}
        instance = Instance(id=instance_id, name=name, input=input_json)
        try:
            self.store.save(instance, current[1] if current else None)
        except (ResourceExistsError, HttpResponseError):
            return 409, {"Message": f"instance {instance_id} was started concurrently"}
        self.work.send_message(instance_id)
        self.stats["started"] += 1
        return 202, {"id": instance_id}

    def status(self, instance_id: str) -> dict[str, Any] | None:
        loaded = self.store.load(instance_id)
        return loaded[0].status_json() if loaded else None

    # -- worker side ------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        await asyncio.gather(*(self._worker(stop, activity) for activity in self.activities))

    async def _worker(self, stop: asyncio.Event, activity: Activity) -> None:
        idle = 0.1
        while not stop.is_set():
            started = time.monotonic()
            try:
                messages = await host_io(lambda: list(self.work.receive_messages(
                    max_messages=1, visibility_timeout=int(self.lease_seconds))))
                activity.polled(started, quiet=not messages)
            except Exception as exc:  # storage away: back off and poll again, like a listener
                log.warning("receiving orchestration work failed (%s); backing off",
                            type(exc).__name__)
                activity.polled(started, quiet=False)
                messages = []
            if not messages:
                await sleep_or_stop(stop, idle)
                idle = min(idle * 2, 1.0)
                continue
            idle = 0.1
            activity.begin()
            try:
                await self._work(messages)
            finally:
                activity.end()

    async def _work(self, messages: list[QueueMessage]) -> None:
        for message in messages:
            try:
                await self.drive(message.content)
            except LostInstance:
                log.info("instance %s was taken over", message.content)
            except Exception:
                log.exception("orchestration %s failed in the local host; retrying later",
                              message.content)
                continue  # the work item becomes visible again after its lease
            try:
                await host_io(self.work.delete_message, message)
            except Exception as exc:  # the item comes back after its lease: harmless
                log.info("deleting work item %s failed: %s", message.id, type(exc).__name__)

    async def drive(self, instance_id: str) -> None:
        """Run one instance until it completes, fails, or waits for nothing we can give."""
        loaded = await host_io(self.store.load, instance_id)
        if loaded is None:
            return
        instance, etag = loaded
        while instance.status in RUNNING:
            if instance.open:
                await self._run_open_activities(instance)
            else:
                await self._episode(instance)
            etag = await self._save(instance, etag)

    async def _save(self, instance: Instance, etag: str) -> str:
        try:
            return await host_io(self.store.save, instance, etag)
        except HttpResponseError as exc:
            raise LostInstance(instance.id) from exc

    # -- one episode: replay the orchestrator over the history ------------------------------
    async def _episode(self, instance: Instance) -> None:
        self.stats["episodes"] += 1
        first = not instance.history
        for event in instance.history:
            event["IsPlayed"] = True
        instance.event(ORCHESTRATOR_STARTED)
        if first:
            instance.status = "Running"
            instance.event(EXECUTION_STARTED, Name=instance.name, Input=instance.input,
                           Version="")
        context = {"history": instance.history, "instanceId": instance.id,
                   "isReplaying": not first, "parentInstanceId": None,
                   "input": instance.input, "upperSchemaVersion": 0}
        orchestrator = self._orchestrator(instance.name)
        try:
            returned = await self.worker.invoke(
                orchestrator, {str(orchestrator.trigger["name"]):
                               bindings.orchestration_trigger(context)})
        except InvocationFailed as exc:  # the orchestrator raised: the instance fails
            self._fail(instance, str(exc))
            return
        state = json.loads(bindings.returned_json(returned))
        actions = [action for group in state.get("actions", []) for action in group]
        for action in actions[instance.actions_seen:]:
            self._schedule(instance, action)
        instance.actions_seen = len(actions)
        instance.event(ORCHESTRATOR_COMPLETED)
        if state.get("isDone"):
            instance.status, instance.output = "Completed", state.get("output")
            instance.event(EXECUTION_COMPLETED, OrchestrationStatus=0,
                           Result=json.dumps(instance.output))
            self.stats["completed"] += 1
        elif not instance.open:
            self._fail(instance, "the orchestrator waits for something the local host does not "
                                 "provide (only activities, with or without retry, are)")

    def _schedule(self, instance: Instance, action: dict[str, Any]) -> None:
        if action["actionType"] not in (CALL_ACTIVITY, CALL_ACTIVITY_WITH_RETRY):
            self._fail(instance, f"action type {action['actionType']} is not supported by "
                                 "the local host")
            return
        event_id = instance.new_id()
        instance.event(TASK_SCHEDULED, event_id, Name=action["functionName"],
                       Input=action.get("input"))
        instance.open[str(event_id)] = {"name": action["functionName"],
                                        "input": action.get("input"),
                                        "retry": action.get("retryOptions"), "attempt": 1}

    def _fail(self, instance: Instance, error: str) -> None:
        instance.status, instance.error = "Failed", error
        instance.open.clear()
        instance.event(EXECUTION_FAILED, Reason=error)
        self.stats["failed"] += 1
        log.warning("orchestration %s failed: %s", instance.id, error)

    # -- activities -------------------------------------------------------------------------
    async def _run_open_activities(self, instance: Instance) -> None:
        tasks = [self._run_activity(instance, int(key)) for key in list(instance.open)]
        await asyncio.gather(*tasks)

    async def _run_activity(self, instance: Instance, event_id: int) -> None:
        while True:
            call = instance.open.pop(str(event_id))
            self.stats["activities"] += 1
            try:
                result = await self._invoke_activity(call["name"], call["input"])
            except Exception as exc:
                self.stats["activity_failures"] += 1
                retry_id = await self._failed(instance, event_id, call, exc)
                if retry_id is None:
                    return
                event_id = retry_id
                continue
            instance.event(TASK_COMPLETED, TaskScheduledId=event_id, Result=result)
            return

    async def _failed(self, instance: Instance, event_id: int, call: dict[str, Any],
                      exc: Exception) -> int | None:
        """Record a failure; with retry options, the timer and (attempts left) the retry."""
        instance.event(TASK_FAILED, TaskScheduledId=event_id, Reason=repr(exc), Details="")
        retry = call["retry"]
        if not retry:
            return None
        timer = instance.new_id()
        delay = retry["firstRetryIntervalInMilliseconds"] / 1000.0
        fire_at = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=delay)).isoformat()
        instance.event(TIMER_CREATED, timer, FireAt=fire_at)
        await asyncio.sleep(delay)
        instance.event(TIMER_FIRED, TimerId=timer, FireAt=fire_at)
        if call["attempt"] >= retry["maxNumberOfAttempts"]:
            return None  # the SDK fails the task once this extra timer has fired
        retry_id = instance.new_id()
        instance.event(TASK_SCHEDULED, retry_id, Name=call["name"], Input=call["input"])
        instance.open[str(retry_id)] = {**call, "attempt": call["attempt"] + 1}
        return retry_id

    async def _invoke_activity(self, name: str, input_json: str | None) -> str:
        function = self._activity(name)
        returned = await self.worker.invoke(
            function, {str(function.trigger["name"]): bindings.activity_trigger(input_json)})
        return bindings.returned_json(returned)

    def _orchestrator(self, name: str) -> Function:
        for function in self.index.of_type("orchestrationTrigger"):
            if function.trigger.get("orchestration", function.name) == name:
                return function
        raise web.HTTPBadRequest(text=json.dumps(
            {"ExceptionMessage": f"The function '{name}' doesn't exist, is disabled, or is "
                                 "not an orchestrator function."}),
            content_type="application/json")

    def _activity(self, name: str) -> Function:
        for function in self.index.of_type("activityTrigger"):
            if function.trigger.get("activity", function.name) == name:
                return function
        raise LookupError(f"no activity named {name!r}")


class DurableApi:
    """The webhook endpoints DurableOrchestrationClient calls: start and status."""

    PREFIX = "/runtime/webhooks/durabletask/"

    def __init__(self, runtime: DurableRuntime) -> None:
        self.runtime = runtime
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post(self.PREFIX + "orchestrators/{name}/{instance}", self._start)
        app.router.add_post(self.PREFIX + "orchestrators/{name}", self._start)
        app.router.add_get(self.PREFIX + "instances/{instance}", self._status)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def client_binding(self) -> str:
        """The JSON the host passes to a ``durableClient`` parameter."""
        base = f"http://127.0.0.1:{self.port}{self.PREFIX}"
        return json.dumps({"taskHubName": self.runtime.hub, "creationUrls": {},
                           "managementUrls": {}, "baseUrl": base, "rpcBaseUrl": base,
                           "requiredQueryStringParameters": ""})

    async def _start(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        instance = request.match_info.get("instance") or uuid.uuid4().hex
        raw = await request.text()
        payload = json.loads(raw) if raw else None
        input_json = payload if isinstance(payload, str) or payload is None else json.dumps(
            payload)
        status, body = await host_io(self.runtime.start, name, instance, input_json)
        return web.json_response(body, status=status)

    async def _status(self, request: web.Request) -> web.Response:
        status = await host_io(self.runtime.status, request.match_info["instance"])
        if status is None:
            return web.json_response({"message": "not found"}, status=404)
        return web.json_response(status, status=200)

