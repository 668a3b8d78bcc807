"""Queue triggers with the Functions host's rules, feeding Microsoft's worker.

From Microsoft.Azure.WebJobs.Extensions.Storage.Queues (``QueueListener``,
``QueueProcessor``), where it matters for an app:

* poll with ``batchSize`` messages per request; fetch the next batch when in-flight drops to
  ``newBatchThreshold``; back off exponentially (from 100 ms up to ``maxPollingInterval``)
  while the queue is empty - and also when a receive fails: the listener logs the error and
  keeps polling, it never stops because storage was away;
* lease each message for 10 minutes and renew the lease at half-interval while the function
  runs; a renewal that fails is retried (the message is not given up because one update
  failed), and renewals stop once the message is gone;
* success: delete the message. Failure: if its dequeue count reached ``maxDequeueCount``,
  copy it to ``<queue>-poison`` and delete it, otherwise make it visible again after
  ``visibilityTimeout``;
* a message whose dequeue count already exceeds ``maxDequeueCount``, or whose body is not
  valid base64 (``messageEncoding: base64``), goes to the poison queue without invoking;
* a body that is not UTF-8 text fails the invocation before the worker sees it (the host's
  binding to a string parameter throws), so it is released and, at ``maxDequeueCount``,
  poisoned like any failure;
* an invocation running longer than ``functionTimeout`` fails (the worker's thread cannot be
  stopped; the host stops waiting for it and settles the message as failed).

The function itself runs in the worker library (``bus.hosting.local.worker``): the listener
sends the message as the host does (``bus.hosting.local.bindings``) and reads the
invocation's status.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import time
from dataclasses import dataclass

from azure.core.exceptions import HttpResponseError, ResourceExistsError, ResourceNotFoundError
from azure.storage.queue import QueueClient, QueueMessage, QueueServiceClient

from bus.hosting.local import bindings
from bus.hosting.local.appsettings import resolve
from bus.hosting.local.hostio import host_io
from bus.hosting.local.protos import TypedData
from bus.hosting.local.worker import Function, InvocationFailed, Worker

log = logging.getLogger("bus.hosting.local.queues")

RENEWAL_RETRY_SECONDS = 5.0
"""Pause before retrying a lease renewal that failed (the lease still has half its time)."""


@dataclass(frozen=True)
class QueueOptions:
    """host.json ``extensions.queues`` and ``functionTimeout``, with the host's defaults."""

    batch_size: int = 16
    new_batch_threshold: int | None = None
    max_polling_interval: float = 60.0
    visibility_timeout: float = 0.0
    max_dequeue_count: int = 5
    message_encoding: str = "base64"
    lease_seconds: float = 600.0
    """The host's lease on a message while its function runs (fixed at 10 minutes there;
    shorter here only so that kill-and-restart tests need not wait that long)."""
    function_timeout: float | None = None
    """host.json ``functionTimeout`` in seconds (None: no limit)."""

    @property
    def threshold(self) -> int:
        if self.new_batch_threshold is not None:
            return self.new_batch_threshold
        return self.batch_size // 2


@dataclass
class Counters:
    invoked: int = 0
    succeeded: int = 0
    failed: int = 0
    timed_out: int = 0
    poisoned: int = 0
    receive_errors: int = 0
    renewal_errors: int = 0


@dataclass
class Activity:
    """One poller's recent work, for ``Host``'s ``until_idle``: when its last receive that
    found nothing started, how much it is running, and when that work last finished."""

    busy: int = 0
    quiet_since: float | None = None
    done_at: float = 0.0

    def polled(self, started: float, quiet: bool) -> None:
        """A receive that started at ``started`` answered; ``quiet``: with nothing (a receive
        that failed is not quiet: storage that is away may hold work)."""
        self.quiet_since = started if quiet else None

    def begin(self) -> None:
        self.busy += 1

    def end(self) -> None:
        self.busy -= 1
        self.done_at = time.monotonic()


def all_idle(activities: list[Activity], done_at: float = 0.0) -> bool:
    """Nothing running, and every poller found nothing in a receive it started after the
    last work anywhere finished (work that sent messages to another poller's queue):
    theirs, or other work that ended at ``done_at``."""
    done = max([done_at, *(a.done_at for a in activities)])
    return all(a.busy == 0 and a.quiet_since is not None and a.quiet_since > done
               for a in activities)


class QueueListener:
    """Feeds one queue-triggered function."""

    def __init__(self, function: Function, worker: Worker, service: QueueServiceClient,
                 options: QueueOptions, extra_inputs: dict[str, TypedData]) -> None:
        self.function = function
        self.worker = worker
        self.queue_name = resolve(str(function.trigger["queueName"]))
        self.queue: QueueClient = service.get_queue_client(self.queue_name)
        self.poison: QueueClient = service.get_queue_client(self.queue_name + "-poison")
        self.options = options
        self.extra_inputs = extra_inputs
        self.counters = Counters()
        self.activity = Activity()
        self._in_flight: set[asyncio.Task[None]] = set()

    async def run(self, stop: asyncio.Event) -> None:
        interval = 0.1
        while not stop.is_set():
            if len(self._in_flight) > self.options.threshold:
                await asyncio.wait(self._in_flight, return_when=asyncio.FIRST_COMPLETED)
                continue
            started = time.monotonic()
            messages = await self._receive()
            self.activity.polled(started, quiet=messages == [])
            if not messages:
                await sleep_or_stop(stop, interval)
                interval = min(interval * 2, self.options.max_polling_interval)
                continue
            interval = 0.1
            for message in messages:
                task = asyncio.create_task(self._guarded(message))
                self._in_flight.add(task)
                self.activity.begin()
                task.add_done_callback(self._finished)
        if self._in_flight:
            await asyncio.wait(self._in_flight)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._in_flight.discard(task)
        self.activity.end()

    async def _receive(self) -> list[QueueMessage] | None:
        """One batch; a failed receive is logged and answers None (the caller backs off as
        after an empty poll)."""
        try:
            return await host_io(self._receive_batch)
        except Exception as exc:  # storage away, throttled, connection reset: keep polling
            self.counters.receive_errors += 1
            log.warning("receiving from %s failed (%s); backing off and polling again",
                        self.queue_name, _short(exc))
            return None

    def _receive_batch(self) -> list[QueueMessage]:
        """One request for up to ``batchSize`` messages, as the host's listener makes
        (``ReceiveMessagesAsync(batchSize, ...)``): iterating the SDK's pager would ask one
        message per request, and ask again whenever a page held fewer than wanted."""
        size = self.options.batch_size
        pages = self.queue.receive_messages(
            messages_per_page=size, max_messages=size,
            visibility_timeout=int(self.options.lease_seconds)).by_page()
        return list(next(pages, []))

    async def _guarded(self, message: QueueMessage) -> None:
        try:
            await self._process(message)
        except Exception:  # storage trouble while settling: the lease expires, it comes back
            log.exception("processing %s on %s", message.id, self.queue_name)

    async def _process(self, message: QueueMessage) -> None:
        if (message.dequeue_count or 1) > self.options.max_dequeue_count:
            await host_io(self._poison, message, "dequeue count over the maximum")
            return
        raw = self._decode(message)
        if raw is None:
            await host_io(self._poison, message, "message decoding failed (not base64)")
            return
        try:
            body = raw.decode("utf-8")
        except UnicodeDecodeError:
            self.counters.failed += 1
            log.info("%s: message %s is not UTF-8 text; the binding fails", self.function.name,
                     message.id)
            await self._settle(message, ok=False)
            return
        renewal = asyncio.create_task(self._renew(message))
        try:
            ok = await self._invoke(message, body)
        finally:
            renewal.cancel()
        await self._settle(message, ok)

    async def _settle(self, message: QueueMessage, ok: bool) -> None:
        try:
            if ok:
                await host_io(self.queue.delete_message, message)
            elif (message.dequeue_count or 1) >= self.options.max_dequeue_count:
                await host_io(self._poison, message, "function failed on the last allowed "
                                                     "delivery")
            else:
                await host_io(self._release, message)
        except HttpResponseError as exc:  # the lease was lost; the message comes back anyway
            if getattr(exc, "error_code", None) == "PopReceiptMismatch":  # as the host: debug
                log.debug("settling %s on %s: its pop receipt changed; the function may have "
                          "modified the message", message.id, self.queue_name)
            else:
                log.info("settling %s on %s failed: %s", message.id, self.queue_name,
                         _short(exc))

    def _decode(self, message: QueueMessage) -> bytes | None:
        """The body's bytes (base64-decoded with ``messageEncoding: base64``)."""
        text = str(message.content)
        if self.options.message_encoding != "base64":
            return text.encode("utf-8")
        try:
            return base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            return None

    async def _invoke(self, message: QueueMessage, body: str) -> bool:
        trigger, metadata = bindings.queue_trigger(message, body)
        inputs = {str(self.function.trigger["name"]): trigger, **self.extra_inputs}
        self.counters.invoked += 1
        try:
            await asyncio.wait_for(self.worker.invoke(self.function, inputs, metadata),
                                   timeout=self.options.function_timeout)
        except TimeoutError:
            self.counters.failed += 1
            self.counters.timed_out += 1
            log.error("%s exceeded functionTimeout (%s s) on message %s; settled as a failure",
                      self.function.name, self.options.function_timeout, message.id)
            return False
        except InvocationFailed as exc:
            self.counters.failed += 1
            log.info("%s failed on delivery %d: %s", self.function.name,
                     message.dequeue_count, exc)
            return False
        self.counters.succeeded += 1
        return True

    async def _renew(self, message: QueueMessage) -> None:
        """Keep the lease while the function runs; retry a failed renewal, stop when the
        message is gone."""
        delay = self.options.lease_seconds / 2
        while True:
            await asyncio.sleep(delay)
            try:
                receipt = await host_io(self.queue.update_message, message,
                                        visibility_timeout=int(self.options.lease_seconds))
            except ResourceNotFoundError:
                log.warning("lease of %s on %s is lost: the message is gone", message.id,
                            self.queue_name)
                return
            except Exception as exc:
                self.counters.renewal_errors += 1
                delay = min(RENEWAL_RETRY_SECONDS, self.options.lease_seconds / 4)
                log.warning("renewing the lease of %s on %s failed (%s); retrying in %.1f s",
                            message.id, self.queue_name, _short(exc), delay)
                continue
            message.pop_receipt = receipt.pop_receipt
            delay = self.options.lease_seconds / 2

    def _release(self, message: QueueMessage) -> None:
        self.queue.update_message(message, visibility_timeout=int(
            self.options.visibility_timeout))

    def _poison(self, message: QueueMessage, why: str) -> None:
        with contextlib.suppress(ResourceExistsError):
            self.poison.create_queue()
        self.poison.send_message(message.content)
        self.queue.delete_message(message)
        self.counters.poisoned += 1
        log.warning("moved message %s from %s to %s-poison: %s", message.id, self.queue_name,
                    self.queue_name, why)


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


async def sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)


def extra_inputs_for(function: Function, client_binding: str | None) -> dict[str, TypedData]:
    """The non-trigger inputs of a queue-triggered function (the Durable client)."""
    inputs: dict[str, TypedData] = {}
    for binding in function.bindings:
        if binding["type"] == "durableClient":
            if client_binding is None:
                raise RuntimeError(f"{function.name} has a durableClient binding but the app "
                                   "has no orchestrator")
            inputs[str(binding["name"])] = bindings.durable_client(client_binding)
    return inputs
