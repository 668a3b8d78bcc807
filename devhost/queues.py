"""Queue triggers with the Functions host's documented semantics.

From Microsoft.Azure.WebJobs.Extensions.Storage (QueueListener, QueueProcessor):

* poll with ``batchSize`` messages per request; fetch the next batch when fewer than
  ``newBatchThreshold`` are in flight; back off exponentially (from 100 ms up to
  ``maxPollingInterval``) while the queue is empty;
* lease each message for 10 minutes and renew the lease at half-interval while the function
  runs;
* success: delete the message. Failure: if its dequeue count reached ``maxDequeueCount``,
  copy it to ``<queue>-poison`` and delete it, otherwise make it visible again after
  ``visibilityTimeout``;
* a message whose dequeue count already exceeds ``maxDequeueCount``, or whose body is not
  valid base64 (``messageEncoding: base64``), goes to the poison queue without invoking.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
from dataclasses import dataclass
from typing import Any

from azure.core.exceptions import HttpResponseError, ResourceExistsError
from azure.functions.queue import QueueMessage as TriggerMessage  # what the worker passes
from azure.storage.queue import QueueClient, QueueMessage, QueueServiceClient

from devhost.loader import Function

log = logging.getLogger("devhost.queues")



@dataclass(frozen=True)
class QueueOptions:
    """host.json ``extensions.queues``, with the host's defaults."""

    batch_size: int = 16
    new_batch_threshold: int | None = None
    max_polling_interval: float = 60.0
    visibility_timeout: float = 0.0
    max_dequeue_count: int = 5
    message_encoding: str = "base64"
    lease_seconds: float = 600.0
    """The host's lease on a message while its function runs (fixed at 10 minutes there;
    shorter here only so that kill-and-restart tests need not wait that long)."""

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
    poisoned: int = 0


class QueueListener:
    """Feeds one queue-triggered function."""

    def __init__(self, function: Function, service: QueueServiceClient, options: QueueOptions,
                 extra_args: dict[str, Any]) -> None:
        self.function = function
        self.queue_name = function.trigger["queueName"]
        self.queue: QueueClient = service.get_queue_client(self.queue_name)
        self.poison: QueueClient = service.get_queue_client(self.queue_name + "-poison")
        self.options = options
        self.extra_args = extra_args
        self.counters = Counters()
        self._in_flight: set[asyncio.Task[None]] = set()

    async def run(self, stop: asyncio.Event) -> None:
        interval = 0.1
        while not stop.is_set():
            if len(self._in_flight) > self.options.threshold:
                await asyncio.wait(self._in_flight, return_when=asyncio.FIRST_COMPLETED)
                continue
            messages = await asyncio.to_thread(self._receive)
            if not messages:
                await sleep_or_stop(stop, interval)
                interval = min(interval * 2, self.options.max_polling_interval)
                continue
            interval = 0.1
            for message in messages:
                task = asyncio.create_task(self._guarded(message))
                self._in_flight.add(task)
                task.add_done_callback(self._in_flight.discard)
        if self._in_flight:
            await asyncio.wait(self._in_flight)

    def _receive(self) -> list[QueueMessage]:
        return list(self.queue.receive_messages(max_messages=self.options.batch_size,
                                                visibility_timeout=int(self.options.lease_seconds)))

    async def _guarded(self, message: QueueMessage) -> None:
        try:
            await self._process(message)
        except Exception:  # storage trouble while settling: the lease expires, it comes back
            log.exception("processing %s on %s", message.id, self.queue_name)

    async def _process(self, message: QueueMessage) -> None:
        if (message.dequeue_count or 1) > self.options.max_dequeue_count:
            await asyncio.to_thread(self._poison, message, "dequeue count over the maximum")
            return
        body = self._decode(message)
        if body is None:
            await asyncio.to_thread(self._poison, message, "body is not valid base64")
            return
        renewal = asyncio.create_task(self._renew(message))
        try:
            ok = await self._invoke(message, body)
        finally:
            renewal.cancel()
        try:
            if ok:
                await asyncio.to_thread(self.queue.delete_message, message)
            elif (message.dequeue_count or 1) >= self.options.max_dequeue_count:
                await asyncio.to_thread(self._poison, message, "function failed on the last "
                                                               "allowed delivery")
            else:
                await asyncio.to_thread(self._release, message)
        except HttpResponseError as exc:  # the lease was lost; the message comes back anyway
            log.info("settling %s on %s failed: %s", message.id, self.queue_name, exc)

    def _decode(self, message: QueueMessage) -> bytes | None:
        text = str(message.content)
        if self.options.message_encoding != "base64":
            return text.encode("utf-8")
        try:
            return base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            return None

    async def _invoke(self, message: QueueMessage, body: bytes) -> bool:
        # azure.functions' QueueMessage constructor has no annotations.
        argument = TriggerMessage(  # type: ignore[no-untyped-call]
            id=message.id, body=body, dequeue_count=message.dequeue_count,
            pop_receipt=message.pop_receipt)
        kwargs = {self.function.trigger["name"]: argument, **self.extra_args}
        self.counters.invoked += 1
        try:
            if self.function.is_async:
                await self.function.user_function(**kwargs)
            else:
                await asyncio.to_thread(self.function.user_function, **kwargs)
        except Exception as exc:
            self.counters.failed += 1
            log.info("%s failed on delivery %d: %s", self.function.name,
                     message.dequeue_count, exc)
            return False
        self.counters.succeeded += 1
        return True

    async def _renew(self, message: QueueMessage) -> None:
        while True:
            await asyncio.sleep(self.options.lease_seconds / 2)
            receipt = await asyncio.to_thread(self.queue.update_message, message,
                                              visibility_timeout=int(self.options.lease_seconds))
            message.pop_receipt = receipt.pop_receipt

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


async def sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
