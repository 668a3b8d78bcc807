"""One simulation run: build the world from a seed, run the workload, check the invariants."""

from __future__ import annotations

import base64
import binascii
import contextlib
import itertools
import json
import random
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from bus import Bus, QueueFull, Settings
from bus.adapters.memory import InMemoryStorage
from bus.envelope import Envelope
from bus.hosting import maintenance
from bus.hosting.worker import Worker
from bus.protocol.delivery import Outcome
from bus.protocol.outbox.slot import Outbox
from bus.protocol.poison.queue import PoisonEntry
from bus.protocol.records import Phase
from bus.protocol.safeguards import Safeguards
from bus.protocol.tokens.inbox import Token, TokenState, finished
from bus.protocol.tokens.shards import SHARDS
from bus.seams import Seams
from bus.storage import StorageError
from bus.storage.limits import AZURE, StorageLimits
from bus.testing.seamed import seamed_bus
from bus.testing.simulate import audited, briefs, sessions, spark
from bus.testing.simulate.console import Console
from bus.testing.simulate.entries import whole_entry
from bus.testing.simulate.functions import (
    HOST_COPY_TTL,
    FunctionsHost,
    Job,
    Operator,
    orchestrator,
)
from bus.testing.simulate.workload import (
    EXPECTED,
    LARGE,
    Happened,
    Knobs,
    Releases,
    SessionPlan,
    Start,
    Step,
    Tally,
    build,
    retry_policy,
)
from bus.testing.simulate.world import Actor, FaultProfile, Gate, World

MAX_STEPS = 200_000
"""Steps a run may take to quiesce; three times as many where the hosts give up after 3
deliveries (they poison and replay far more: some runs need 400,000), and half as many again
where more than one storage call in eight fails (``FLAKY``)."""
FLAKY = 0.12
"""A run whose storage fails more often than this (failed before, after, or late: summed)
repeats so much that it gets half as many steps again. Since the Functions hosts keep a failed
handler's retry delay (before, they redelivered at once), every "replay all" of an entry that
fails each time costs its 50 deliveries times the delay: 594864499, which fails 16 % of calls,
needs 274,488 steps."""
STALLED_SECONDS = 5.0  # maintenance finishes records committed this long ago
MAX_SKEW_SECONDS = 30.0
"""How far a worker process's clock may be off the others' (and storage's) in a skewed run."""
ORPHAN_AGE_SECONDS = 4.0
"""The orphan age of half of the runs: past it, a live token with no signal yet is poisoned as a
presumed orphan. Short, so that backlogs, stalls and scheduled sends outlast it and signals come
after all (the other half never presume one, as a deployment far from its 7 days)."""
SHORT_VISIBILITY_SECONDS = 61
"""The queues' visibility limit in half of the runs: the longest delay the bus asks for is
then one second (a minute less), shorter than the scheduled sends' delays of up to three."""
SETTINGS = Settings(
    max_delivery_count=50,  # poisoning after handler failures is tested elsewhere
    lease_seconds=10.0, ghost_horizon_seconds=600.0,
    orphan_age_seconds=1e9,  # or ORPHAN_AGE_SECONDS: drawn per run
    release_resend_seconds=2.0,
    pending_age_seconds=1.0,  # the sweeper meets records still being committed
    send_attempts=10_000,  # the client never gives up (a send that raises is not exactly-once)
    depth_check_seconds=0.2,
    stats_flush_seconds=None,  # written on timer threads: none here (maintenance forgets old
    # days all the same: see briefs.FORGOTTEN_DAY)
    peek_lease_seconds=20.0)  # scaled with the host copies' time-to-live (HOST_COPY_TTL)


@dataclass
class RunResult:
    seed: int
    messages: int
    faults: dict[str, int]
    violations: list[str] = field(default_factory=list)
    steps: int = 0
    statistics: Counter[str] = field(default_factory=Counter)
    """Claims that started from a remembered slot ("hits") and those of them that lost their
    compare-and-swap because someone else had written the slot since ("stale"); signals sent
    in bundles of two or more ("bundled"); client sends that shared a flush ("grouped") and
    those a flush left undone, finished alone ("repaired")."""


PURGING_BREAKS = frozenset({"purge-around-poisoning"})
"""Breaks shown by the focused workload ``run_once(purging=True)`` (its race needs a purge at
one moment, which the ordinary operator meets too seldom): their known seeds and searches
(``--every-break``, ``--quick-seed``) run it."""


def run_once(seed: int, safeguards: Safeguards | None = None,
             routes: Counter[str] | None = None, *, purging: bool = False) -> RunResult:
    """One run from ``seed``; ``routes`` counts the dashboard routes the operator called
    (``bus.testing.simulate.surface``). ``purging``: the focused workload of an operator who
    purges ``t``'s poison queue every few tenths of a second (``Console``), for races with a
    purge that the ordinary operator meets too seldom to find."""
    rng = random.Random(seed)
    profile = FaultProfile.draw(rng)
    world = World(rng.getrandbits(64), profile)
    storage = InMemoryStorage(hooks=world, limits=_limits(seed))
    knobs = _knobs(seed, rng, profile)
    layout = random.Random(seed ^ 0x51075)  # apart from ``rng``: its draws stay as they were
    settings, shard_run = _settings(seed, layout)
    processes = layout.random() < 0.5  # each worker its own Bus: its own slot cache
    senders = layout.choice((1, 2, 6))  # client actors sending at once (their sends group)
    with_spark = random.Random(seed ^ 0x5BA4).random() < 0.5  # a Spark job and query
    releases = Releases(explicit=random.Random(seed ^ 0x6E4).random() < 0.75)
    plan_briefs = _briefs(seed, knobs)

    def new_bus(offset: float = 0.0, routes: Mapping[Any, str] | None = None) -> Bus:
        seams = Seams(clock=(lambda: world.now() + offset) if offset else world.now,
                      new_id=world.new_id, sleep=world.sleep,
                      safeguards=safeguards or Safeguards(), random=world.rng.random,
                      gate=lambda: Gate(world), pool=briefs.inline_pool,
                      lanes=briefs.inline_pool, shard_run=shard_run)
        endpoints = build(knobs, world.rng.random, world.new_id, releases)
        if plan_briefs is not None:
            endpoints += briefs.endpoints(plan_briefs, retry_policy(knobs), world.rng.random,
                                          world.new_id, knobs.handler_failure)
        return seamed_bus(seams, storage, endpoints, prefix="sim", settings=settings,
                          routes=routes)

    bus = new_bus()
    bus.provision()
    buses = [bus]
    roots = range(rng.randint(2, 6))
    # With Spark, a write job publishes the odd roots' Start and a streaming query reads
    # every Happened (its endpoint subscribes to the topic); the client sends the rest.
    spark_roots = [root for root in roots if with_spark and root % 2]
    client_roots = [root for root in roots if root not in spark_roots]
    garbage = _garbage(bus, world, rng.randint(0, 2))
    # A client using ``send`` must not crash: without the send ledger, re-sending after a crash
    # sends twice, by design (see bus.protocol.send.sender). With ``send_once`` (half of the runs)
    # it crashes like everyone else and starts over from its first message. Its storage calls
    # fail in every way either way.
    once = rng.random() < 0.5
    senders = 1 if once else senders  # the send ledger's path does not group
    plan = knobs.sessions
    tallies = _client_tallies(plan, len(roots), once)
    clients = [Actor(f"client#{index}", _client(bus, world, client_roots[index::senders],
                                                garbage if index == 0 else [], once=once,
                                                tallies=tallies[index::senders],
                                                failed=plan.numbering_failed if plan else None),
                     crashable=once) for index in range(senders)]
    handoffs: list[Job] = []
    counts: Counter[str] = Counter()
    checkpoint = spark.Checkpoint(batch=random.Random(seed ^ 0xBA7C4).random() < 0.5)
    if with_spark:
        clients.append(_start_spark(world, bus, bus_for=lambda routes: new_bus(routes=routes),
                                    partitions=_spark_partitions(spark_roots, rng),
                                    checkpoint=checkpoint, counts=counts))
    if plan_briefs is not None:
        clients.append(Actor("client-briefs", briefs.client(
            bus, plan_briefs, world.rng, world.sleep, lambda call: _until_ok(world, call)),
            crashable=False))
    for client in clients:
        world.spawn(client)
    buses += _spawn_instances(bus, world, rng, seed, new_bus=new_bus if processes else None,
                              handoffs=handoffs, counts=counts)
    world.spawn(Actor("orchestrator", orchestrator(bus, world, handoffs, counts)))
    outage = Outage.draw(seed, world.now())
    passes = SessionPasses()
    console = _spawn_operators(bus, world, releases, counts, plan_briefs=plan_briefs,
                               plan=plan, routes=routes, outage=outage, passes=passes,
                               watch=random.Random(seed ^ 0x3A7C4).random() < 0.5,
                               deploying=_deploying(seed, plan), purging=purging)

    watch = _Watch(bus, storage, world, clients=clients, handoffs=handoffs,
                   receivers=[*bus.topology.endpoints, *([spark.READER] if with_spark else [])],
                   plan=plan, console=console,
                   garbage={body for body, _ in garbage},
                   checkpoint=checkpoint if with_spark else None, outage=outage,
                   passes=passes)

    def expire_lease() -> bool:
        return storage.queues.expire_lease(lambda ids: world.rng.randrange(len(ids)))

    budget = _budget(settings, profile)
    with (briefs.watching_expiry(bus, storage, plan_briefs) if plan_briefs is not None
          else contextlib.nullcontext()), audited.completions() as acted:
        settled = world.run(watch.quiescent, expire_lease, storage.queues.next_visible_at,
                            budget)
        pending = [] if settled else list(itertools.islice(watch.still_to_do(), 5))
        world.stop()
    return _outcome(seed, world, bus, buses=buses, settled=settled, roots=len(roots),
                    garbage=[body for body, _ in garbage], counts=counts, releases=releases,
                    checkpoint=checkpoint if with_spark else None, noted=knobs.noted,
                    plan=plan, briefs_plan=plan_briefs, pending=pending, acted=acted,
                    seen=console.violations)


def _budget(settings: Settings, profile: FaultProfile) -> int:
    """The steps a run may take to quiesce (``MAX_STEPS``)."""
    budget = MAX_STEPS * (3 if settings.max_delivery_count <= 3 else 1)
    if profile.fail_before + profile.fail_after + profile.ghost > FLAKY:
        budget += budget // 2
    return budget


@dataclass
class _Watch:
    """When a run is over: nothing left to do for anyone."""

    bus: Bus
    storage: InMemoryStorage
    world: World
    clients: list[Actor]
    handoffs: list[Job]
    receivers: list[str]
    plan: SessionPlan | None
    console: Console
    garbage: set[str]
    checkpoint: spark.Checkpoint | None
    outage: Outage | None
    passes: SessionPasses

    def quiescent(self) -> bool:
        return next(self.still_to_do(), None) is None

    def still_to_do(self) -> Iterator[str]:
        """What keeps the run from being over, lazily: the first is enough to go on, and the
        first few say what a run that reached its budget was stuck on."""
        bus, storage, now = self.bus, self.storage, self.world.now()
        if self.outage is not None and now < self.outage.end:
            yield "maintenance to come back"  # what waits for it must not pass for settled
        yield from (f"{c.name} still sending" for c in self.clients if not c.finished)
        if self.handoffs:
            yield f"{len(self.handoffs)} orchestrations to run"
        yield from (f"queue {e} not empty" for e in self.receivers
                    if storage.queues.bodies(bus.names.queue(e)))
        yield from (f"{t.state.value} token {t.endpoint}/{t.message_id}"
                    for t in bus.parts.inbox.all()
                    if _in_flight(t) and not _left_waiting(t, self.plan, self.passes))
        yield from (f"an entry to act on in poison queue {e}" for e in self.receivers
                    if any(self._to_replay(e, body)
                           for body in storage.queues.bodies(bus.names.poison_queue(e))))
        yield from (f"unfinished record {where}" for where in _unfinished_records(bus, storage))
        if self.checkpoint is not None and spark.unread(bus, self.checkpoint):
            yield "Happened copies the Spark query has not read"

    def _to_replay(self, endpoint: str, body: str) -> bool:
        if endpoint == briefs.ENDPOINT:
            return self.console.waiting(body)
        return _to_replay(self.storage, body, self.garbage)


def _briefs(seed: int, knobs: Knobs) -> briefs.BriefPlan | None:
    """The Briefs of half of the runs; with them, the console's operator, who also acts on
    the sessions (s bounded, then, in some runs)."""
    plan = briefs.BriefPlan.draw(seed)
    if plan is not None and knobs.sessions is not None:
        knobs.sessions.operator = True
        knobs.sessions.bounded = random.Random(seed ^ 0x5B0).choice((None, 1, 2))
    return plan


def _spawn_instances(bus: Bus, world: World, rng: random.Random, seed: int, *,
                     new_bus: Callable[[float], Bus] | None, handoffs: list[Job],
                     counts: Counter[str]) -> list[Bus]:
    """Two or three instances of each endpoint, each a Functions host or a polling worker
    (``hosting``), each its own process with its own bus (and clock, skewed in half of the
    runs) when ``new_bus`` makes them; the buses made."""
    hosting = random.Random(seed ^ 0xF0C7)  # which host runs each endpoint instance
    functions_share = hosting.choice((0.0, 0.5, 1.0))  # polling workers, Functions, or both
    # Concurrent invocations per Functions instance (they share claim rounds), drawn apart
    # from ``hosting``: its draws stay as they were.
    invocations = random.Random(seed ^ 0x1DC0)
    offsets = _clock_offsets(seed)
    made: list[Bus] = []
    for endpoint in bus.topology.endpoints:
        for index in range(rng.randint(2, 3)):
            offset = next(offsets)
            own = new_bus(offset) if new_bus is not None else bus
            counts["skewed_processes"] += new_bus is not None and offset != 0.0
            made.append(own)
            functions = hosting.random() < functions_share
            concurrent = invocations.choice((1, 1, 2, 3)) if functions else 1
            for actor in _instance(own, world, endpoint, index, functions=functions,
                                   concurrent=concurrent, handoffs=handoffs, counts=counts):
                world.spawn(actor)
    return made


def _spawn_operators(bus: Bus, world: World, releases: Releases, counts: Counter[str], *,
                     plan_briefs: briefs.BriefPlan | None, plan: SessionPlan | None,
                     routes: Counter[str] | None, outage: Outage | None,
                     passes: SessionPasses, watch: bool, deploying: float | None,
                     purging: bool = False) -> Console:
    """The operators: one replaying what storage errors poisoned, the one at the console
    (in the runs with Briefs: the others run as they did) with, when ``watch`` and it acts
    on the sessions, one watching them, and the releaser with the maintenance timer. Returns
    the console (not spawned when there are no Briefs); it pauses ``s`` from the start for
    ``deploying`` seconds when it acts on the sessions."""
    # Not t: what becomes of its entries is the console's to decide (and reading them hides
    # them from other readers for the peek lease: Settings.peek_lease_seconds).
    world.spawn(Operator(bus, world, [e for e in bus.topology.endpoints if e != briefs.ENDPOINT],
                         {t for _, t in EXPECTED} | {"Start", "Noted", "Tally", "Debrief",
                                                     "Briefed", *Step.aliases}, counts).actor())
    operated = plan if plan is not None and plan.operator else None
    console = Console(bus, world, plan_briefs, routes if routes is not None else Counter(),
                      sessions=operated, deploying=deploying if operated else None,
                      purging=purging)
    if plan_briefs is not None:
        world.spawn(console.actor())
    if plan_briefs is not None and plan is not None and plan.operator and watch:
        world.spawn(console.watcher(counts))
    # Maintenance runs in every run (but for an outage, in some): it collects pending tokens
    # of handler runs that never committed while workers are still committing theirs,
    # releases deferrals and finishes records whose orchestration never ran.
    world.spawn(Actor("releaser", _releaser(
        bus, world, releases, counts, release=console.release if plan_briefs else None,
        outage=outage, passes=passes)))
    return console


def _outcome(seed: int, world: World, bus: Bus, *, buses: list[Bus], settled: bool, roots: int,
             garbage: list[str], counts: Counter[str], releases: Releases,
             checkpoint: spark.Checkpoint | None, noted: bool,
             plan: SessionPlan | None, briefs_plan: briefs.BriefPlan | None,
             pending: list[str], acted: Counter[str], seen: list[str]) -> RunResult:
    """The run's result: what it exercised and, once it quiesced, what it violated (and
    what the operators ``seen`` go wrong as it happened, quiesced or not)."""
    storage = bus.storage
    assert isinstance(storage, InMemoryStorage)
    tallies = len(plan.labels(roots)) if plan is not None else 0
    result = RunResult(seed, roots * len(EXPECTED) + len(garbage) + tallies,
                       dict(world.counters.faults), steps=world.steps,
                       statistics=_statistics(buses))
    result.violations.extend(world.deaths)
    result.violations.extend(seen)
    if not settled:
        result.violations.append(f"did not quiesce within {world.steps} steps (still to do: "
                                 f"{'; '.join(pending) or 'nothing seen'})")
        return result
    _last_sweep(bus, world)
    counts["audited_actions"] += sum(acted.values())
    result.statistics.update(counts)
    result.violations.extend(audited.check(bus, storage, acted))
    result.statistics.update(_seen_at_the_end(bus, storage, set(garbage)))
    result.statistics["expired_messages"] += storage.queues.expired
    if plan is not None:  # first: the most telling of a broken session
        found = sessions.look(bus, storage, plan)
        result.statistics.update(sessions.statistics(found))
        result.violations.extend(sessions.check(found, plan, roots))
    if briefs_plan is not None:
        result.statistics.update(briefs.statistics(bus, storage, briefs_plan))
        result.violations.extend(briefs.check(bus, storage, briefs_plan))
    result.violations.extend(check(bus, storage, roots, garbage, noted))
    result.violations.extend(releases.violations)
    if checkpoint is not None:
        result.violations.extend(_spark_checks(bus, storage, world, checkpoint, roots))
    return result


def _instance(bus: Bus, world: World, endpoint: str, index: int, *, functions: bool,
              concurrent: int, handoffs: list[Job], counts: Counter[str]) -> list[Actor]:
    """One instance of ``endpoint``: a Functions host (``concurrent`` invocations at once,
    an actor each) or a polling worker."""
    if functions:
        host = FunctionsHost(bus, world, endpoint, handoffs, counts)
        name = f"{endpoint}#{index}(functions)"
        return [Actor(name if concurrent == 1 else f"{name}/{n}", host.run)
                for n in range(concurrent)]
    return [Actor(f"{endpoint}#{index}", _worker(bus, world, endpoint, counts))]


def _start_spark(world: World, bus: Bus, *, bus_for: Callable[[Mapping[Any, str] | None], Bus],
                 partitions: list[list[dict[str, Any]]], checkpoint: spark.Checkpoint,
                 counts: Counter[str]) -> Actor:
    """The streaming query (its endpoint subscribed to the event first) and the write job's
    actor, to be spawned with the clients."""
    spark.subscribe_reader(bus, Happened)
    world.spawn(Actor("spark-query", spark.reader(world, bus, checkpoint, counts)))
    connection = spark.SimConnection(bus.storage, bus_for, bus.names.prefix)
    return Actor("spark-job", spark.writer(world, connection, Start, destination="a",
                                           partitions=partitions, counts=counts))


def _spark_partitions(roots: list[int], rng: random.Random) -> list[list[dict[str, Any]]]:
    """The rows of the write job, in one to three partitions (some possibly empty)."""
    partitions: list[list[dict[str, Any]]] = [[] for _ in range(rng.randint(1, 3))]
    for root in roots:
        partitions[root % len(partitions)].append(
            {"root": root, "pad": "x" * LARGE if rng.random() < 0.3 else None})
    return partitions


def _spark_checks(bus: Bus, storage: InMemoryStorage, world: World,
                  checkpoint: spark.Checkpoint, roots: int) -> list[str]:
    """The query's sink holds every root's event exactly once; nothing is left in staging or
    in the reader's poison queue."""
    read = spark.read_roots(bus, checkpoint)
    violations = list(checkpoint.violations)
    violations.extend(f"root {root}: Happened read by spark {read[root]} times"
                      for root in range(roots) if read[root] != 1)
    violations.extend(spark.left_in_staging(bus, checkpoint, world.now()))
    entries = [whole_entry(storage, body)
               for body in storage.queues.bodies(bus.names.poison_queue(spark.READER))]
    violations.extend(f"poisoned at {spark.READER}: {entry.reason}" for entry in entries
                      if not _orphan_report(entry))
    return violations


def _last_sweep(bus: Bus, world: World) -> None:
    """Past the ghost horizon by every process's clock (a fast one stamped its fences ahead),
    one sweep, and what the host poisoned adopted (read like the rest)."""
    world.clock += SETTINGS.ghost_horizon_seconds + MAX_SKEW_SECONDS + 1
    bus.sweeper().sweep()
    for endpoint in bus.topology.endpoints:
        bus.poisoned(endpoint).adopt()


def _limits(seed: int) -> StorageLimits:
    """Azure's limits; in half of the runs queues whose longest visibility delay is a second
    (as 7 days are for a send scheduled weeks ahead): later scheduled copies arrive early and
    are put back until due."""
    if random.Random(seed ^ 0x7D).random() < 0.5:
        return AZURE
    return replace(AZURE, visibility_seconds=SHORT_VISIBILITY_SECONDS)


def _clock_offsets(seed: int) -> Iterator[float]:
    """How far each worker process's clock is off storage's: skewed in half of the runs."""
    skew = random.Random(seed ^ 0x5CE3)
    skewed = skew.random() < 0.5
    while True:
        yield skew.uniform(-MAX_SKEW_SECONDS, MAX_SKEW_SECONDS) if skewed else 0.0


def _knobs(seed: int, rng: random.Random, profile: FaultProfile) -> Knobs:
    return Knobs(partitions=rng.randint(1, 3), handler_failure=profile.handler_failure,
                 immediate=rng.randint(1, 3), retry_after=profile.handler_failure / 2,
                 scheduled=rng.choice((0.0, 0.3, 1.0)), bounded=rng.choice((None, 1, 2)),
                 defer=rng.choice((0.0, 0.5, 1.0)), declared_reads=rng.random() < 0.5,
                 deferrals=random.Random(seed ^ 0xDEF).choice((1, 2, 3)),  # again: 2 in 3
                 noted=random.Random(seed ^ 0x707).random() < 0.5,  # c sends on every run
                 sessions=_session_plan(seed))


def _session_plan(seed: int) -> SessionPlan | None:
    """Endpoint s and its sessions in half of the runs (drawn apart: the other half runs as
    before). Two or three sessions sharing one or two partitions; half of the endpoints skip
    gaps after a reorder window of 1-4 virtual seconds (a copy delayed by a crash, a lease or
    a retry longer than that is skipped: it must end in the poison queue), and half of
    those have a Tally whose handler rejects it on every delivery (a real gap)."""
    draw = random.Random(seed ^ 0x5E5510)
    if draw.random() < 0.5:
        return None
    skip = draw.random() < 0.5
    keys = tuple(f"k{index}" for index in range(draw.randint(2, 3)))
    return SessionPlan(keys=keys, partitions=draw.choice((1, 2)), per_root=draw.randint(1, 2),
                       from_b=draw.random() < 0.5, from_client=draw.randint(1, 2),
                       close=draw.random() < 0.5, skip_gaps=skip,
                       window=draw.uniform(1.0, 4.0) if skip else 300.0,
                       doomed="e-0-k0-0" if skip and draw.random() < 0.5 else None)


def _settings(seed: int, layout: random.Random) -> tuple[Settings, int]:
    """The run's settings, and how many attempt ids in a row name one token shard."""
    horizon = random.Random(seed ^ 0x0AF4)  # a short orphan age in half of the runs
    # In a third of the runs the hosts give up after 3 deliveries (the host's poison queue,
    # adoption, replays: often), in the others after 50 (seldom).
    deliveries = random.Random(seed ^ 0xDE1).choice((3, 50, 50))
    # Token shards: one (the layout before shards), or several with ids moving to the next
    # every id, every two or after 100 (batches split over partitions, or not).
    shards = random.Random(seed ^ 0x54A2D)  # apart from the others: they stay as they were
    return SETTINGS.model_copy(update={
        "slot_cache_size": layout.choice((0, 4, 1024)),
        "signal_bundles": layout.random() < 0.75, "group_sends": layout.random() < 0.75,
        "orphan_age_seconds": horizon.choice((ORPHAN_AGE_SECONDS, 1e9)),
        "max_delivery_count": deliveries,
        "token_shards": shards.choice((1, 3, SHARDS))}), shards.choice((1, 2, 100))


def _seen_at_the_end(bus: Bus, storage: InMemoryStorage, garbage: set[str]) -> Counter[str]:
    """Messages deferred a second time, and tokens poisoned as presumed orphans (their
    messages processed all the same)."""
    return Counter(
        deferred_again=sum(
            row.row_key.startswith("wait.") and row.properties.get("generation") == 1
            for row in storage.tables.rows(bus.names.state_table("c"))),
        presumed_orphans=sum(
            _orphan_report(whole_entry(storage, body)) for e in bus.topology.endpoints
            for body in storage.queues.bodies(bus.names.poison_queue(e)) if body not in garbage))


def _statistics(buses: list[Bus]) -> Counter[str]:
    counts: Counter[str] = Counter()
    unique = {id(b): b for b in buses}.values()
    parts = [b.parts for b in unique]
    for receiver in (p.receiver(e) for p in parts for e in p.topology.endpoints):
        counts.update(hits=receiver.slots.hits, stale=receiver.slots.stale)
    counts.update(bundled=sum(p.courier.bundled for p in parts),
                  grouped=sum(p.sender.group.grouped for p in parts if p.sender.group),
                  repaired=sum(p.sender.repaired for p in parts))
    return counts


# -- actors -------------------------------------------------------------------------------------
def _client(bus: Bus, world: World, roots: Sequence[int],
            garbage: list[tuple[str, Envelope | None]], *, once: bool,
            tallies: Sequence[tuple[str, str]] = (),
            failed: set[str] | None = None) -> Callable[[], None]:
    """A client: its roots' Starts, its Tallies (noting in ``failed`` the sessions of those
    whose numbered send raised a storage error), then the garbage."""
    noted: set[str] = set() if failed is None else failed

    def send_all() -> None:
        for root in roots:
            pad = "x" * LARGE if world.rng.random() < 0.3 else ""
            if once:
                bus.send_once(Start(root=root, pad=pad), message_id=f"root{root}")
            else:
                bus.send(Start(root=root, pad=pad), message_id=f"root{root}")
        for label, key in tallies:
            _send_tally(bus, world, Tally(session=key, label=label), once, noted)
        for body, envelope in garbage:
            if envelope is not None:  # a well-formed envelope of an unknown type, with a token
                _until_ok(world, lambda e=envelope: bus.parts.inbox.create(  # type: ignore[misc]
                    e.destination, e.attempt_id, e.message_id, world.now()))
            _until_ok(world, lambda b=body: bus.storage.queues.send(  # type: ignore[misc]
                bus.names.queue("a"), b))

    return send_all


def _client_tallies(plan: SessionPlan | None, roots: int, once: bool) -> list[tuple[str, str]]:
    """The Tallies the clients send, (label, session) - the plan settled first."""
    if plan is None:
        return []
    plan.settle(roots, once)
    return list(plan.client_labels().items())


def _send_tally(bus: Bus, world: World, tally: Tally, once: bool, failed: set[str]) -> None:
    """``send_once`` (not numbered: handled in arrival order), or ``send``, numbered in the
    client's stream and sent again when it raises: a failure of ``send`` here is one of the
    numbering (the client's sends never give up after it), so nothing was sent."""
    message_id = f"tally-{tally.label}"
    if once:  # called again after QueueFull (a bounded s): it finishes what it recorded
        _until_ok(world, lambda: _ignore(bus.send_once(tally, message_id=message_id)))
        return

    def send() -> None:
        try:
            bus.send(tally, message_id=message_id)
        except QueueFull:
            raise  # refused for room before anything was written: it took no number
        except StorageError:  # its number may be lost
            failed.add(tally.session)
            raise

    _until_ok(world, send)


def _ignore(_: object) -> None:
    return None


def _until_ok(world: World, call: Callable[[], None]) -> None:
    """``call`` again until it does not raise a storage error (nor QueueFull: a bounded
    queue, full now; the send wrote nothing)."""
    while True:
        try:
            call()
            return
        except (StorageError, QueueFull):
            world.sleep(0.1)


def _worker(bus: Bus, world: World, endpoint: str, counts: Counter[str]) -> Callable[[], None]:
    def work() -> None:
        # Both paths: one message at a time, and batches (Receiver.handle_many).
        worker = Worker(bus, endpoint, batch_size=world.rng.randint(1, 6), sleep=world.sleep,
                        retry_delay=0.5, wait=lambda _: world.rng.uniform(0.01, 0.2),
                        batched=world.rng.random() < 0.7, renew_leases=False)
        while True:
            early = worker.outcomes.get(Outcome.SCHEDULED.value, 0)
            try:
                leased = worker.poll_once()
            except StorageError:
                leased = 0
            counts["early_copies_put_back"] += worker.outcomes.get(
                Outcome.SCHEDULED.value, 0) - early
            if not leased:
                world.sleep(0.5)

    return work


def _unfinished_records(bus: Bus, storage: InMemoryStorage) -> list[str]:
    """The outbox slots holding a record still to finish (maintenance finishes them: one whose
    incoming token the sweeper poisoned as a presumed orphan is no exception)."""
    tokens = {(t.endpoint, t.attempt_id): t for t in bus.parts.inbox.all()}
    return [f"{endpoint}/{slot.partition}" for endpoint in bus.topology.endpoints
            for slot in Outbox(storage.tables, bus.names.state_table(endpoint)).pending()
            if slot.record is not None and not finished(
                slot.record, tokens.get((endpoint, slot.record.attempt_id)))]


def _in_flight(token: Token) -> bool:
    """A message not done yet: live, pending or deferred (fenced tokens are tombstones, the
    sweeper removes them after the ghost horizon; poisoned ones wait for a replay)."""
    return token.state in (TokenState.LIVE, TokenState.PENDING, TokenState.DEFERRED)


def _left_waiting(token: Token, plan: SessionPlan | None, passes: SessionPasses) -> bool:
    """Whether a copy set aside in its session (a deferred token at ``s``: its handler never
    defers) will wait for good once nothing else moves: at an endpoint that blocks, no copy
    is left to come before it; at one that skips gaps, a maintenance pass that began once its
    reorder window had passed moved the sessions on without failing (a time limit instead
    would end a run whose injected faults failed every pass until then: no violation of
    the protocol's). The run then ends, and the sessions check reports it (nothing may be
    left waiting).

    The token's ``since`` is the deferring process's clock, up to ``MAX_SKEW_SECONDS`` off
    storage's: the pass must begin that long after it too, or it may have read the session
    before the copy was set aside (a process 4 s slow set one aside 4 s after the stamp)."""
    if plan is None or token.endpoint != sessions.ENDPOINT:
        return False
    if token.state is not TokenState.DEFERRED:
        return False
    if plan.operator:
        return False  # the operator skips the gap in the end (``console.Console``)
    # The copy's stamp in the session row comes before ``since``, from the same clock, so
    # ``since + window`` is past its window; ``since + MAX_SKEW_SECONDS``, past its
    # set-aside in storage's time.
    return not plan.skip_gaps or passes.since(token.since + max(plan.window, MAX_SKEW_SECONDS))


@dataclass
class SessionPasses:
    """When the latest maintenance pass that moved the sessions on without failing began."""

    last: float = float("-inf")

    def since(self, moment: float) -> bool:
        """Whether such a pass began at ``moment`` or later."""
        return self.last >= moment


def _to_replay(storage: InMemoryStorage, body: str, garbage: set[str]) -> bool:
    """Whether a poison-queue body still needs maintenance or the operator: anything the host
    moved there itself, not adopted yet (its copy expires: the run is not over until it is),
    and an entry of a message the operator has to replay (not the garbage the run injected)."""
    try:
        entry = whole_entry(storage, body)
        if _orphan_report(entry) or sessions.settled(entry):
            return False  # a report, or a copy the operator leaves (the sessions check's)
        return entry.original_body not in garbage
    except (ValueError, binascii.Error):
        return True  # the host moved it: adopted (then replayed, unless garbage)


def _deploying(seed: int, plan: SessionPlan | None) -> float | None:
    """The seconds ``s`` is paused for from the start (a deployment under way) in a third of
    the runs where it is bounded: the client's first numbered sends meet a full queue."""
    draw = random.Random(seed ^ 0xDE9107)
    if plan is None or plan.bounded is None or draw.random() >= 1 / 3:
        return None
    return draw.uniform(1.0, 4.0)


@dataclass(frozen=True)
class Outage:
    """Maintenance stopped for longer than the host's poison copies live (``HOST_COPY_TTL``,
    the service's 7 days scaled), from ``start`` to ``end`` (virtual seconds): its timer
    disabled, say; a run is not over before it ends. Deferred messages wait past their
    release, records whose orchestration never ran stay unfinished, pending tokens and
    presumed orphans are not collected; once it is back, everything catches up. (What the
    host moved to a poison queue is adopted by the operators' readings meanwhile - every
    reader of a poison queue adopts first - where a deployment with nobody looking would
    lose it: docs/protocol.md.)"""

    start: float
    end: float

    @staticmethod
    def draw(seed: int, now: float) -> Outage | None:
        """An outage in a quarter of the runs (starting at ``now``), beginning in their
        first seconds."""
        draw = random.Random(seed ^ 0x0DA6E)
        if draw.random() >= 0.25:
            return None
        start = now + draw.uniform(1.0, 15.0)
        return Outage(start, start + HOST_COPY_TTL * draw.uniform(1.05, 1.5))

    def covers(self, now: float) -> bool:
        return self.start <= now < self.end


def _releaser(bus: Bus, world: World, releases: Releases, counts: Counter[str], *,
              release: Callable[[str, str, int], object] | None = None,
              outage: Outage | None = None,
              passes: SessionPasses | None = None) -> Callable[[], None]:
    """An operator releasing what is deferred at ``c`` now and then (each release naming the
    deferral the operator saw, as ``Releases`` records; through ``release``, the console's,
    in the runs that have one), and the maintenance timer (the
    sweeper: it re-sends the signals of releases that stopped half-way; the adoption of what
    the host poisoned itself; the recovery of records whose orchestration never ran or
    stopped), but during the ``outage``; ``passes`` learns of each pass that moved the
    sessions on."""
    counts["maintenance_outages"] += outage is not None

    def release_all() -> None:
        deferred = bus.deferred("c")
        while True:
            with contextlib.suppress(StorageError):
                for message in deferred.list():
                    root = int(json.loads(message.envelope.payload or "{}")["root"])
                    if (not releases.explicit and message.deferrals == 0
                            and root not in _finished(bus)):
                        continue  # e's to release (see Releases)
                    releases.permitted.add((root, message.deferrals))
                    if release is None:
                        deferred.release(message.message_id, deferrals=message.deferrals)
                    else:  # the console's way in: the API or the dashboard
                        release("c", message.message_id, message.deferrals)
            if outage is None or not outage.covers(world.now()):  # the Functions app's timer
                began = world.now()
                report = maintenance.maintenance_pass(bus, STALLED_SECONDS)
                counts["overdue_releases"] += sum(report.sessions_released.values())
                if passes is not None and sessions.ENDPOINT in report.sessions_released:
                    passes.last = began  # (an endpoint's count is there when it succeeded)
            world.sleep(1.0)

    return release_all


def _finished(bus: Bus) -> set[int]:
    """The roots whose Finish ``e`` has handled (committed), read outside the simulated
    storage's faults: the operator's view of the business."""
    storage = bus.storage
    assert isinstance(storage, InMemoryStorage)
    return {int(row.properties["root"])  # type: ignore[arg-type]
            for row in storage.tables.rows(bus.names.state_table("e"))
            if row.row_key.startswith("fx.") and row.properties["type"] == "Finish"}


def _garbage(bus: Bus, world: World, count: int) -> list[tuple[str, Envelope | None]]:
    unknown = Envelope(
        message_id=world.new_id(), attempt_id=world.new_id(), kind="command",
        message_type="NoSuchType", source="client", destination="a", correlation_id="x",
        sent_at=datetime.fromtimestamp(world.now(), tz=timezone.utc), payload="{}")
    candidates: list[tuple[str, Envelope | None]] = [
        ("this is not base64!", None),
        (base64.b64encode(b"{broken json").decode(), None),
        (base64.b64encode(unknown.to_json().encode()).decode(), unknown),
    ]
    return [candidates[world.rng.randrange(len(candidates))] for _ in range(count)]


# -- invariants ---------------------------------------------------------------------------------
def check(bus: Bus, storage: InMemoryStorage, roots: int, garbage: list[str],
          noted: bool = False) -> list[str]:
    return [*_effects(bus, storage, roots, noted), *_left_behind(bus, storage),
            *_poison(bus, storage, garbage)]


def _effects(bus: Bus, storage: InMemoryStorage, roots: int, noted: bool) -> list[str]:
    """Every message's effect applied exactly once; counters agree (no lost updates)."""
    violations: list[str] = []
    applied: Counter[tuple[str, int, str]] = Counter()
    deferrals: Counter[tuple[str, int, int]] = Counter()
    for endpoint in bus.topology.endpoints:
        per_partition: Counter[str] = Counter()
        counters: dict[str, object] = {}
        for row in storage.tables.rows(bus.names.state_table(endpoint)):
            if row.row_key.startswith("wait."):
                deferrals[(endpoint, int(row.properties["root"]),  # type: ignore[arg-type]
                           int(row.properties["generation"]))] += 1  # type: ignore[arg-type]
            elif row.row_key.startswith("fx."):
                applied[(endpoint, int(row.properties["root"]),  # type: ignore[arg-type]
                         str(row.properties["type"]))] += 1
                per_partition[row.partition_key] += 1
            elif row.row_key == "counter":
                counters[row.partition_key] = row.properties["n"]
        for partition, effects in per_partition.items():
            if counters.get(partition) != effects:
                violations.append(f"{endpoint}/{partition}: counter {counters.get(partition)} "
                                  f"but {effects} effects (lost update)")
    for root in range(roots):
        # With Noted, one per run of c's handler: each deferral's and the last one's.
        runs = len({g for (e, r, g) in deferrals if (e, r) == ("c", root)}) + 1
        for endpoint, message_type in (*EXPECTED, *(
                ("e", f"Noted{generation}") for generation in range(runs if noted else 0))):
            n = applied.pop((endpoint, root, message_type), 0)
            if n != 1:
                what = "lost" if n == 0 else f"applied {n} times"
                violations.append(f"root {root}: {message_type} at {endpoint} {what}")
    violations.extend(f"unexpected effect {key}" for key in applied)
    violations.extend(f"root {root}: deferral {generation} applied {n} times at {endpoint}"
                      for (endpoint, root, generation), n in deferrals.items() if n > 1)
    return violations


def _left_behind(bus: Bus, storage: InMemoryStorage) -> list[str]:
    tokens = bus.parts.inbox.all()
    # Every token's signal comes in the end (senders fence what they cannot finish), so a
    # token still poisoned as a presumed orphan had none: a token created again after its
    # message was processed (a late request), which any copy would process once more.
    violations = [f"left behind: {t.state.value} token {t.endpoint}/{t.attempt_id} "
                  f"of {t.message_id}{' (a presumed orphan)' if t.orphan else ''}"
                  for t in tokens if t.state is not TokenState.POISONED or t.orphan]
    by_key = {(t.endpoint, t.attempt_id): t for t in tokens}
    for endpoint in bus.topology.endpoints:
        outbox = Outbox(storage.tables, bus.names.state_table(endpoint))
        for slot in outbox.pending():  # a finished record may stay in its slot
            assert slot.record is not None
            if not finished(slot.record, by_key.get((endpoint, slot.record.attempt_id))):
                violations.append(f"left behind: unfinished outbox record in {endpoint}/"
                                  f"{slot.partition}")
    kept = _payloads_of_entries(bus, storage)
    violations.extend(f"left behind: payload blob {ref.blob}" for ref in bus.parts.payloads.refs()
                      if ref.blob not in kept)
    violations.extend(f"left behind: deferral index of {stale.message_id} at {stale.endpoint}"
                      for stale in bus.parts.inbox.stale_index())
    ledger = Outbox(storage.tables, bus.names.ledger_table)
    violations.extend(f"left behind: ledger record {slot.partition} in phase "
                      f"{slot.record.phase.value}" for slot in ledger.pending()
                      if slot.record is not None and slot.record.phase is not Phase.DONE)
    return violations


def _payloads_of_entries(bus: Bus, storage: InMemoryStorage) -> set[str]:
    """The payload blobs of poison entries left where they are (a replay needs them)."""
    kept: set[str] = set()
    for endpoint in bus.topology.endpoints:
        for body in storage.queues.bodies(bus.names.poison_queue(endpoint)):
            envelope = whole_entry(storage, body).envelope
            if envelope is not None and envelope.payload_ref is not None:
                kept.add(envelope.payload_ref.blob)
    return kept


def _orphan_report(entry: PoisonEntry) -> bool:
    """The sweeper's report of a token it poisoned as a presumed orphan (no body)."""
    return entry.envelope is None and not entry.original_body and entry.reason.startswith(
        "orphan inbox token")


def _poison(bus: Bus, storage: InMemoryStorage, garbage: list[str]) -> list[str]:
    """Exactly the bad signals are in the poison queue, each at least once; nothing else."""
    violations: list[str] = []
    poisoned: list[str] = []
    for endpoint in bus.topology.endpoints:
        for body in storage.queues.bodies(bus.names.poison_queue(endpoint)):
            entry = whole_entry(storage, body)
            if _orphan_report(entry):
                continue  # what became of its message, the effects and tokens tell
            if endpoint == sessions.ENDPOINT and sessions.settled(entry):
                continue  # what its session says of it, the sessions check tells
            if endpoint == briefs.ENDPOINT and briefs.final(entry):
                continue  # left by the operator: the Briefs' check tells
            if entry.original_body not in garbage:
                violations.append(f"poisoned at {endpoint}: {entry.reason}")
            poisoned.append(entry.original_body)
    violations.extend(f"bad signal not in the poison queue: {body[:40]!r}"
                      for body in garbage if body not in poisoned)
    return violations
