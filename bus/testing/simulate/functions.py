"""The Functions host's side in the simulation: its queue rules around the bus's trigger, the
Durable orchestration's steps, and an operator replaying poisoned messages.

The host follows ``bus.hosting.local.queues`` (itself the host's ``QueueProcessor``): a
message whose dequeue count is over ``maxDequeueCount``, or whose body is not base64, is
copied to the poison queue without invoking the function; the function's return deletes the
message, its exception makes it visible again - or, on the last delivery allowed, copies it to
the poison queue. The orchestration runs the outbox driver's steps as the activities do: at
least once each, sometimes repeated, sometimes never started (maintenance then finishes the
record).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from bus.adapters.memory import InMemoryStorage
from bus.bus import Bus
from bus.hosting.functions.trigger import QueueTrigger
from bus.protocol.delivery import Handoff, Outcome
from bus.protocol.poison.queue import PoisonEntry
from bus.storage import QueueMessage, StorageError
from bus.testing.simulate.entries import whole_entry
from bus.testing.simulate.sessions import settled
from bus.testing.simulate.world import Actor, Gate, World

SIGNAL_BATCH = 2  # copies per signal activity (the app's is 16; small here, to interleave)
HOST_COPY_TTL = 120.0
"""How long the host's poison copies live: the service's default of 7 days, scaled as the
simulation's maintenance runs every second where a deployment's runs every five minutes, and
its poison-queue tools lease what they read for 20 seconds instead of 60 (a shorter lease runs
out under the simulation's stalls while an operator's replay is still reading)."""


class FunctionsHost:
    """One instance of the Functions host for one endpoint's queue trigger. Several actors
    may run it at once (``run``): concurrent invocations in one worker process, which share
    claim rounds (``bus.hosting.functions.rounds``)."""

    def __init__(self, bus: Bus, world: World, endpoint: str, handoffs: list[Job],
                 counts: Counter[str]) -> None:
        self.bus = bus
        self.world = world
        self.queue = bus.names.queue(endpoint)
        self.poison = bus.names.poison_queue(endpoint)
        self.max = bus.settings.max_delivery_count
        self.handoffs = handoffs
        self.counts = counts
        rng = world.rng
        self.batch = rng.randint(1, 4)
        self.trigger = QueueTrigger(
            bus, endpoint, max_dequeue_count=self.max,
            inline_dispatch_max=rng.choice((None, 0, 1)), in_process_tries=rng.randint(1, 3),
            sleep=world.sleep, wait=lambda _: rng.uniform(0.01, 0.2), gate=lambda: Gate(world))
        self._shared = 0

    def run(self) -> None:
        while True:
            try:
                messages = self.bus.storage.queues.receive(
                    self.queue, max_messages=self.batch, lease=self.bus.settings.lease_seconds)
            except StorageError:
                messages = []
            if not messages:
                self.world.sleep(0.5)
            for message in messages:
                with contextlib.suppress(StorageError):  # the lease runs out; it comes back
                    self._deliver(message)

    def _deliver(self, message: QueueMessage) -> None:
        raw = _base64(message.body)
        if raw is None or message.dequeue_count > self.max:
            self._poison(message)
            return
        self.counts["functions_deliveries"] += 1
        try:
            delivery = self.trigger.deliver(raw, message.dequeue_count, lease=message)
        except Exception:  # the function failed: released, or poisoned on the last delivery
            if message.dequeue_count >= self.max:
                self._poison(message)
            else:
                self.bus.storage.queues.extend(self.queue, message, lease=0)
            return
        rounds = self.trigger.rounds
        self.counts["invocations_in_shared_rounds"] += rounds.shared - self._shared
        self._shared = rounds.shared
        parts = delivery.parts or (delivery,)
        self.counts["functions_requeued"] += sum(part.outcome is Outcome.REQUEUED for part in parts)
        self.counts["functions_postponed"] += any(part.outcome is Outcome.POSTPONED
                                                  for part in parts)
        self.counts["early_copies_put_back"] += sum(
            part.outcome is Outcome.SCHEDULED for part in parts)
        for handoff in delivery.handoffs:
            self.counts["orchestrations_started"] += 1
            self.handoffs.append(handoff)
        # A postponed message's pop receipt changed: the host's delete fails, and it lets it be.
        self.bus.storage.queues.delete(self.queue, message)

    def _poison(self, message: QueueMessage) -> None:
        self.counts["host_poisoned"] += 1
        self.counts["expiring_host_copies"] += 1
        storage = self.bus.storage
        assert isinstance(storage, InMemoryStorage)
        # The host's copy keeps the queue's default time-to-live: it expires unless adopted.
        storage.queues.send(self.poison, message.body, time_to_live=HOST_COPY_TTL)
        self.bus.storage.queues.delete(self.queue, message)


def orchestrator(bus: Bus, world: World, handoffs: list[Job],
                 counts: Counter[str]) -> Callable[[], None]:
    """The outbox orchestrations, their activities interleaved in any order, as Durable runs
    many instances at once: each step at least once, some repeated, some never started."""
    done: dict[tuple[str, str, str], Handoff] = {}  # the last orchestrated record per message

    def run() -> None:
        while True:
            if not handoffs:
                world.sleep(0.5)
                continue
            job = handoffs.pop(world.rng.randrange(len(handoffs)))
            if isinstance(job, LateFinish) and job.at > world.now():
                handoffs.append(job)
                world.sleep(0.1)
                continue
            if isinstance(job, Handoff):
                late = _late_for_predecessor(job, done, world)
                done[_message(job)] = job
                if late is not None:  # it runs first; the orchestration after it
                    counts["orchestrations_repeated"] += 1
                    handoffs.append(job)
                    job = late
                elif world.rng.random() < 0.1:
                    counts["orchestrations_never_run"] += 1  # maintenance finishes the record
                    continue
            try:
                after = _step(bus, world, job)
            except StorageError:
                handoffs.append(job)  # the activity is retried
                continue
            if after is not None:
                handoffs.append(after)
            elif not isinstance(job, LateFinish) and world.rng.random() < 0.2:
                counts["orchestrations_repeated"] += 1
                # A replay, or start_new of a finished instance - or the finish activity
                # alone, retried late (its result lost), as Durable retries activities.
                late = LateFinish(job.handoff if isinstance(job, Running) else job,
                                  world.now() + world.rng.uniform(0.0, 5.0))
                handoffs.append(late if world.rng.random() < 0.7 else late.handoff)

    return run


@dataclass(frozen=True)
class Running:
    """An orchestration past its ``prepare`` activity: ``sent`` of ``copies`` signalled."""

    handoff: Handoff
    copies: int
    sent: int = 0


@dataclass(frozen=True)
class LateFinish:
    """The ``finish`` activity of an orchestration, run again on its own, not before ``at``
    (a retry after its first result was lost)."""

    handoff: Handoff
    at: float


Job = Handoff | Running | LateFinish
"""What the orchestrator actor has to run: an orchestration's next activity, or one finish
again."""


def _late_for_predecessor(handoff: Handoff, done: dict[tuple[str, str, str], Handoff],
                          world: World) -> LateFinish | None:
    """Sometimes, when a later record of a message is handed off, the finish activity of the
    message's previous orchestration, retried late, runs before the new orchestration's
    first step: when a step that finds its record by message id alone would finish the new
    record without its signals (``steps-by-message-id``)."""
    before = done.get(_message(handoff))
    if before is None or before.key == handoff.key or world.rng.random() >= 0.5:
        return None
    return LateFinish(before, world.now())


def _message(handoff: Handoff) -> tuple[str, str, str]:
    return handoff.endpoint, handoff.key.partition, handoff.key.message_id


def _step(bus: Bus, world: World, job: Job) -> Job | None:
    """Run one activity of ``job``; returns what is left of it (None: it is over)."""
    if isinstance(job, LateFinish):
        bus.parts.outbox_driver(job.handoff.endpoint).finish(job.handoff.key)
        return None
    handoff = job.handoff if isinstance(job, Running) else job
    driver = bus.parts.outbox_driver(handoff.endpoint)
    if isinstance(job, Handoff):
        copies = driver.prepare(handoff.key)
        if world.rng.random() < 0.2:
            copies = driver.prepare(handoff.key)  # an activity that ran twice
        return None if copies is None else Running(handoff, copies)
    if job.sent < job.copies:
        end = min(job.sent + SIGNAL_BATCH, job.copies)
        driver.signal(handoff.key, list(range(job.sent, end)))
        return Running(handoff, job.copies, end)
    driver.finish(handoff.key)
    return None


class Operator:
    """Someone replaying the poisoned messages of messages the endpoints handle, while the workers
    run (what the host or the bus poisoned after storage errors) - not a copy its session
    refused or its handler rejected: replayed, it would be poisoned again.

    Every 5 seconds; and alerted at once when a poison queue gains an entry to replay
    (``alerted``, read outside the simulated storage's faults), it replays that endpoint's
    entries urgently: before anyone else takes another step, as an operator who is quick where
    the poisoner is slow. Its replay then meets a poisoning that has written its entry and has
    yet to poison the token (``bus.protocol.poison.poisoning``), and an adoption likewise."""

    def __init__(self, bus: Bus, world: World, endpoints: list[str], known: set[str],
                 counts: Counter[str]) -> None:
        storage = bus.storage
        assert isinstance(storage, InMemoryStorage)
        self._storage = storage
        self._bus = bus
        self._world = world
        self._endpoints = endpoints
        self._known = known
        self._counts = counts
        self._wanted: dict[str, bool] = {}  # by poison-queue body
        self._seen = self._sizes()

    def actor(self) -> Actor:
        return Actor("operator", self.run, alarm=self.alerted)

    def alerted(self) -> bool:
        """Whether a poison queue holds more entries to replay than when last looked at."""
        return any(size > self._seen[e] for e, size in self._sizes().items())

    def run(self) -> None:
        while True:
            self._world.sleep(5.0)  # or less: woken by ``alerted``
            sizes = self._sizes()
            grown = [e for e in self._endpoints if sizes[e] > self._seen[e]]
            self._seen = sizes
            if not grown:
                for endpoint in self._endpoints:
                    self._replay(endpoint)
                continue
            self._counts["alerted_replays"] += 1
            with self._world.urgently():
                for endpoint in grown:
                    self._replay(endpoint)

    def _replay(self, endpoint: str) -> None:
        letters = self._bus.poisoned(endpoint)
        try:
            if not self._bus.storage.queues.depth(self._bus.names.poison_queue(endpoint)):
                return
            chosen = {letter.id for letter in letters.entries() if self._chosen(letter.entry)}
            if chosen:
                self._counts["poisoned_replayed"] += len(letters.replay(chosen))
        except StorageError:
            return

    def _chosen(self, entry: PoisonEntry) -> bool:
        return (entry.envelope is not None and entry.original_body != ""
                and entry.envelope.message_type in self._known and not settled(entry))

    def _sizes(self) -> dict[str, int]:
        """The entries to replay in each poison queue: what ``_chosen`` picks, and what it may
        pick once read whole or adopted (an entry kept in a blob, a copy the host moved)."""
        return {e: sum(self._to_replay(body) for body in
                       self._storage.queues.bodies(self._bus.names.poison_queue(e)))
                for e in self._endpoints}

    def _to_replay(self, body: str) -> bool:
        wanted = self._wanted.get(body)
        if wanted is None:
            try:
                entry = whole_entry(self._storage, body)
                wanted = entry.entry_ref is not None or self._chosen(entry)
            except (ValueError, binascii.Error):
                wanted = True
            self._wanted[body] = wanted
        return wanted


def _base64(body: str) -> bytes | None:
    try:
        return base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        return None
