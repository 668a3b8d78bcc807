"""Briefs: the simulated traffic of the bus's whole client surface, and what it must show.

    client --Brief/Briefing--> t --Debrief/Briefed--> u

The client sends each Brief by another of the bus's ways (``send``, ``publish``, ``send_once``,
``publish_once``, ``send_once_many``, ``send_many``) with every option they take: a
time-to-live (short ones expire in a backlog or a pause), a delay, headers, a correlation id,
an explicit destination. Some Briefs carry a partition key from hostile data: reserved for
the bus's own rows, too long, with characters Table Storage forbids. Some carry payloads near
the limits: a few hundred bytes either side of what a queue message carries inline, or one
large enough for a blob. ``t``'s handler reads what its context offers, writes, reads and
deletes state, and sends one follow-up per Brief to ``u`` with the Brief's payload (a command
with ``to=``, or an event, each with options) - or, for some, a fan-out of follow-ups whose
outbox record is within a few bytes a copy of the most a record holds (or a little past it);
``u`` is bounded in some runs (back-pressure keeps ``t``'s records waiting to send).

The operator's side (``bus.testing.simulate.console``) replays, replays without the
time-to-live, purges or leaves ``t``'s poison entries, through the Python API, the command
line and the dashboard's routes. Once a run has quiesced, per Brief (``check``):

1. its effect at ``t`` happened at most once, each follow-up's at ``u`` at most once;
2. if its handler committed, each of its follow-ups was handled: committed work is never lost,
   not to expiry, not to a purge;
3. if its handler never committed, the operator purged it, or its entry is left in the poison
   queue for a reason replaying cannot cure (expired, a partition key the bus refuses, a
   fan-out a few bytes over what a record holds);
4. no copy of a Brief is poisoned as expired once its handler committed (judged as it
   happens: ``watching_expiry``), and no entry left says ``expired`` for a Brief whose
   handler ran;
5. no handler's own check failed (a deleted row that came back, a send the middleware did not
   stamp): an entry with such an exception, even one the operator then purged, is a violation.
"""

from __future__ import annotations

import contextlib
import functools
import random
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import Any

from bus import (
    Bus,
    Command,
    Context,
    Endpoint,
    Event,
    Middleware,
    Outgoing,
    RecordTooLarge,
    RetryPolicy,
)
from bus.adapters.memory import InMemoryStorage
from bus.envelope import Envelope
from bus.middleware import SendNext
from bus.naming import RESERVED_PARTITION_PREFIX
from bus.observability.stats import day_partition
from bus.protocol.delivery import Outcome
from bus.protocol.poison.poisoning import Poisoning
from bus.protocol.poison.queue import PoisonEntry
from bus.protocol.safeguards import Safeguards
from bus.seams import Seams
from bus.storage.limits import AZURE
from bus.testing.drain import drain
from bus.testing.seamed import seamed_bus
from bus.testing.simulate.entries import whole_entry
from bus.testing.simulate.world import START_TIME

ENDPOINT = "t"
FOLLOWER = "u"
LONG_TTL = 30 * 24 * 3600.0
"""The follow-ups' time-to-live: given, never reached in a run."""
WAYS = ("send", "send-delayed", "publish", "send_once", "publish_once", "send_once_many",
        "send_many")
FORGOTTEN_DAY = day_partition(START_TIME - 8 * 24 * 3600)
"""The statistics' day that maintenance deletes during a run (kept 7 days, then the day after
is removed whole): a handler's state in that partition would go with it."""
HOSTILE_KEYS = (FORGOTTEN_DAY, f"{RESERVED_PARTITION_PREFIX}x",
                "a/b", "back\\slash", "hash#", "what?", "tab\tkey", "k" * 600)
"""Partition keys from hostile data: reserved, forbidden characters, over the 1 KiB limit."""
ODD_KEYS = ("k0", "k1", "ключ", "key with spaces", "~tilde", "k" * 200)
"""Partition keys a user's data may hold that the bus must take."""
FINAL = ("expired", "partition key")
"""Reasons replaying cannot cure: the operator may leave such an entry for good."""
TOO_LARGE = "RecordTooLarge"
"""The exception of a fan-out over what a record holds: no replay cures it either."""
SIZES = ("small", "blob", "near-inline", "fan-out")
SIZE_WEIGHTS = (60, 10, 15, 15)
INLINE_PADS = (AZURE.signal_bytes - 650, AZURE.signal_bytes - 250)
"""A near-inline Brief's payload: its signal a few hundred bytes under or over what a queue
message carries inline (the envelope around it takes about 450)."""
BLOB_PAD = 50_000
FAN_OUTS = (4, 12)
"""How many follow-ups a fan-out Brief's handler sends (each with a payload that fills the
record to within a few bytes a copy of its limit, or past it by less than the room a commit
keeps for what later passes add)."""


class Brief(Command):
    n: int
    key: str
    pad: str = ""


class Briefing(Event):
    n: int
    key: str
    pad: str = ""


class Debrief(Command):
    n: int
    i: int = 0
    pad: str = ""


class Briefed(Event):
    n: int
    i: int = 0
    pad: str = ""


TYPES = {"Brief", "Briefing", "Debrief", "Briefed"}


@dataclass
class BriefPlan:
    """The run's Briefs: how each is sent, its key, its time-to-live; ``u``'s bound. What the
    run records as it goes: each Brief's message id, what the operator purged."""

    ways: list[str]
    keys: list[str]
    ttls: list[float | None]
    bounded: int | None
    sizes: list[str] = field(default_factory=list)
    fan_outs: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Brief -> how many follow-ups its handler sends and the payload length of each."""
    message_ids: dict[int, str] = field(default_factory=dict)
    purged: set[str] = field(default_factory=set)
    """Message ids whose poison entries a purge removed."""
    expired_after_commit: list[str] = field(default_factory=list)
    """Briefs whose copy was poisoned as expired after their handler had committed (seen as
    it happened, by ``watching_expiry``)."""
    failed_checks: list[str] = field(default_factory=list)
    """The exceptions of entries whose handler's own assertion failed (seen by the operator,
    whatever it then did with the entry)."""

    @classmethod
    def draw(cls, seed: int) -> BriefPlan | None:
        """Briefs in half of the runs (drawn apart from the run's other draws)."""
        draw = random.Random(seed ^ 0xB41EF)
        if draw.random() < 0.5:
            return None
        count = draw.randint(4, 10)
        keys = [draw.choice(HOSTILE_KEYS) if draw.random() < 0.2 else draw.choice(ODD_KEYS)
                for _ in range(count)]
        ttls = [draw.choice((None, draw.uniform(0.5, 4.0), 600.0)) for _ in range(count)]
        sizes = draw.choices(SIZES, weights=SIZE_WEIGHTS, k=count)
        plan = cls(ways=[draw.choice(WAYS) for _ in range(count)], keys=keys, ttls=ttls,
                   bounded=draw.choice((None, 1, 2)), sizes=sizes)
        for n, size in enumerate(sizes):
            if size == "fan-out":
                copies = draw.randint(*FAN_OUTS)
                # Mostly the largest payload that fits (less up to 4 bytes a copy, or 1 over);
                # else one between that and what the record holds as committed, which only
                # the room kept for what later passes add refuses (RecordTooLarge).
                fits = fan_out_pad(n % 2, copies, keys[n], reserve=True)
                pad = (fits - draw.randint(-1, 4) if draw.random() < 0.6 else
                       draw.randint(fits + 1, fan_out_pad(n % 2, copies, keys[n],
                                                          reserve=False) + 4))
                plan.fan_outs[n] = (copies, max(0, pad))
        return plan

    def pad(self, n: int, rng: random.Random) -> str:
        """The payload of Brief ``n`` as its size says."""
        size = self.sizes[n] if n < len(self.sizes) else "small"
        if size == "blob":
            return "x" * BLOB_PAD
        if size == "near-inline":
            return "x" * rng.randint(*INLINE_PADS)
        return ""


@contextlib.contextmanager
def watching_expiry(bus: Bus, storage: InMemoryStorage, plan: BriefPlan) -> Iterator[None]:
    """While a run lasts, note each Brief's copy poisoned as expired after its handler had
    committed (its effect at ``t`` written, read outside the faults, before the poisoning
    was asked): the entry would say ``expired`` for a handler that ran. Judged as it happens:
    an entry written before the commit may land later (a write that timed out), and a
    replay may remove one written after."""
    original = Poisoning.expired

    def expired(self: Poisoning, body: str, envelope: Envelope, *rest: Any) -> Outcome:
        committed = self.endpoint == ENDPOINT and _committed(bus, storage, plan,
                                                             envelope.message_id)
        outcome = original(self, body, envelope, *rest)
        if committed and outcome is Outcome.EXPIRED:
            plan.expired_after_commit.append(envelope.message_id)
        return outcome

    Poisoning.expired = expired  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        Poisoning.expired = original  # type: ignore[method-assign]


def _committed(bus: Bus, storage: InMemoryStorage, plan: BriefPlan, message_id: str) -> bool:
    numbers = [n for n, sent in plan.message_ids.items() if sent == message_id]
    return bool(numbers) and any(
        row.row_key.startswith(f"brief.{numbers[0]}.")
        for row in storage.tables.rows(bus.names.state_table(ENDPOINT)))


class Stamp(Middleware):
    """``t``'s middleware: stamps its sends (the handler checks the header arrived)."""

    def send(self, outgoing: Outgoing, call_next: SendNext) -> None:
        outgoing.headers["stamped"] = "t"
        call_next(outgoing)


def endpoints(plan: BriefPlan, policy: RetryPolicy, roll: Callable[[], float],
              new_id: Callable[[], str], failure: float) -> list[Endpoint]:
    """``t`` and ``u``."""
    t = Endpoint(ENDPOINT, retry=policy, middleware=[Stamp()])
    u = Endpoint(FOLLOWER, retry=policy, max_queue_depth=plan.bounded)
    quick = RetryPolicy(immediate=2, backoff_initial=0.01, delays=(0.2,))

    def on_brief(message: Brief | Briefing, ctx: Context) -> None:
        if roll() < failure:
            raise RuntimeError("injected handler failure")
        seen = ctx.state.get("scratch")  # a read of a row every attempt deletes again
        assert seen is None, "a deleted row came back"
        ctx.state.put("scratch", {"n": message.n})
        ctx.state.delete("scratch")
        ctx.state.put(f"brief.{message.n}.{new_id()}", {
            "n": message.n, "message_id": ctx.message_id,
            "correlation_id": ctx.correlation_id, "headers": len(ctx.headers)})
        copies, length = plan.fan_outs.get(message.n, (1, -1))
        pad = message.pad if length < 0 else "y" * length
        for i in range(copies):
            if message.n % 2:
                ctx.send(Debrief(n=message.n, i=i, pad=pad), to=FOLLOWER, ttl=LONG_TTL,
                         headers={"brief": ctx.message_id})
            else:
                ctx.publish(Briefed(n=message.n, i=i, pad=pad), ttl=LONG_TTL,
                            delay=roll() * 0.5, headers={"brief": ctx.message_id})
        if roll() < failure:  # after its writes and sends: the attempt must leave nothing
            raise RuntimeError("injected handler failure after its writes")

    t.handles(Brief, partition=lambda m: m.key, retry=quick)(on_brief)
    t.handles(Briefing, partition=lambda m: m.key)(on_brief)

    def on_follow_up(message: Debrief | Briefed, ctx: Context) -> None:
        if roll() < failure:
            raise RuntimeError("injected handler failure")
        assert ctx.headers.get("stamped") == "t", "t's middleware did not stamp its send"
        ctx.state.put(f"debrief.{message.n}.{message.i}.{new_id()}",
                      {"n": message.n, "i": message.i})

    u.handles(Debrief, partition=lambda m: f"u{m.n % 2}")(on_follow_up)
    u.handles(Briefed, partition=lambda m: f"u{m.n % 2}")(on_follow_up)
    return [t, u]


@functools.cache
def fan_out_pad(parity: int, copies: int, key: str, *, reserve: bool) -> int:
    """The longest payload with which ``t``'s handler still commits ``copies`` follow-ups of a
    Brief of that parity and key: the limit of an outbox record, found by a binary search on
    scratch buses running the same handler (envelopes alike to a few bytes a copy) - with
    the room a commit keeps for what later passes add, or (``reserve`` False) without."""
    low, high = 0, AZURE.entity_bytes // copies
    while low < high:
        middle = (low + high + 1) // 2
        if _commits(parity, copies, middle, key, reserve):
            low = middle
        else:
            high = middle - 1
    return low


def _commits(n: int, copies: int, pad: int, key: str, reserve: bool) -> bool:
    plan = BriefPlan(ways=[], keys=[], ttls=[], bounded=None, fan_outs={n: (copies, pad)})
    storage = InMemoryStorage()
    count = iter(range(1 << 30))
    bus = seamed_bus(Seams(safeguards=Safeguards(reserve_record_growth=reserve)), storage,
                     endpoints(plan, RetryPolicy(), lambda: 0.5,
                               lambda: f"{next(count):032x}", 0.0), prefix="sim")
    bus.provision()
    bus.send(Brief(n=n, key=key), message_id=f"brief{n}", correlation_id="conversation0",
             headers={"n": str(n)}, ttl=600.0)
    try:
        drain(bus, [ENDPOINT], fail_fast=False)
    except RecordTooLarge:  # its check passed (no room kept), its write did not
        return True
    return any(row.row_key.startswith("brief.")
               for row in storage.tables.rows(bus.names.state_table(ENDPOINT)))


class Inline(Executor):
    """``send_many``'s pool in the simulation: each send runs when submitted, in the caller's
    greenlet (the actors share one thread)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as exc:  # the future carries it, as a pool's does
            future.set_exception(exc)
        return future


def inline_pool(workers: int) -> Executor:
    return Inline()


def client(bus: Bus, plan: BriefPlan, rng: random.Random, sleep: Callable[[float], None],
           until_ok: Callable[[Callable[[], None]], None]) -> Callable[[], None]:
    """The client of the Briefs: each sent one of the bus's ways, some together."""
    def send_all() -> None:
        pending = list(range(len(plan.ways)))
        while pending:
            n = pending.pop(0)
            way = plan.ways[n]
            if way in ("send_once_many", "send_many"):
                group = [n, *[m for m in pending if plan.ways[m] == way][:2]]
                pending = [m for m in pending if m not in group]
                _send_together(bus, plan, group, way=way, rng=rng, until_ok=until_ok)
            else:
                _send_one(bus, plan, n, way=way, rng=rng, until_ok=until_ok)
            sleep(rng.uniform(0.0, 0.5))

    return send_all


def _send_one(bus: Bus, plan: BriefPlan, n: int, *, way: str, rng: random.Random,
              until_ok: Callable[[Callable[[], None]], None]) -> None:
    message_id = f"brief{n}"
    key, ttl = plan.keys[n], plan.ttls[n]
    headers = {"n": str(n)} if rng.random() < 0.5 else None
    correlation = f"conversation{n % 3}" if rng.random() < 0.5 else None
    pad = plan.pad(n, rng)
    plan.message_ids[n] = message_id
    # ``send`` and ``publish`` retry storage errors while making copies (Settings.send_attempts,
    # never exhausted here); one raised before (reading the topic, say), nothing was sent.
    if way in ("send", "send-delayed"):
        to = ENDPOINT if rng.random() < 0.5 else None
        delay = rng.uniform(0.1, 2.0) if way == "send-delayed" else 0.0
        until_ok(lambda: _ignore(bus.send(
            Brief(n=n, key=key, pad=pad), message_id=message_id, ttl=ttl, headers=headers,
            correlation_id=correlation, to=to, delay=delay)))
    elif way == "publish":
        delay = rng.uniform(0.1, 2.0) if rng.random() < 0.5 else 0.0
        until_ok(lambda: _ignore(bus.publish(
            Briefing(n=n, key=key, pad=pad), message_id=message_id, ttl=ttl, headers=headers,
            correlation_id=correlation, delay=delay)))
    elif way == "send_once":
        to = ENDPOINT if rng.random() < 0.5 else None
        until_ok(lambda: _ignore(bus.send_once(
            Brief(n=n, key=key, pad=pad), message_id=message_id, ttl=ttl, headers=headers,
            correlation_id=correlation, to=to)))
    else:
        until_ok(lambda: _ignore(bus.publish_once(
            Briefing(n=n, key=key, pad=pad), message_id=message_id, ttl=ttl, headers=headers,
            correlation_id=correlation)))


def _send_together(bus: Bus, plan: BriefPlan, group: list[int], *, way: str,
                   rng: random.Random, until_ok: Callable[[Callable[[], None]], None]) -> None:
    """Several Briefs in one call: ``send_once_many`` (one time-to-live for all, the first's)
    or ``send_many`` (none: it takes no options per message)."""
    to = ENDPOINT if rng.random() < 0.5 else None
    if way == "send_once_many":
        ttl = plan.ttls[group[0]]
        for n in group:
            plan.ttls[n] = ttl
            plan.message_ids[n] = f"brief{n}"
        messages: list[tuple[Command | Event, str]] = [
            (Brief(n=n, key=plan.keys[n]) if n % 2 else Briefing(n=n, key=plan.keys[n]),
             f"brief{n}") for n in group]
        until_ok(lambda: _ignore(bus.send_once_many(
            messages, to=to, ttl=ttl, headers={"batch": str(group[0])},
            origin=f"job{group[0]}")))
        return
    for n in group:
        plan.ttls[n] = None
    ids = bus.send_many([Brief(n=n, key=plan.keys[n]) for n in group], to=to,
                        max_in_flight=rng.randint(1, 3))
    plan.message_ids.update(zip(group, ids, strict=True))


def _ignore(_: object) -> None:
    return None


# -- what the run must show -------------------------------------------------------------------
def final(entry: PoisonEntry) -> bool:
    """An entry replaying cannot cure: the operator may leave it."""
    return entry.envelope is not None and entry.envelope.message_type in TYPES and (
        any(reason in entry.reason for reason in FINAL)
        or (entry.exception or "").startswith(TOO_LARGE))


def _effects(bus: Bus, storage: InMemoryStorage) -> Counter[tuple[str, int, int]]:
    """How many times each handler's effect happened: (endpoint, Brief, follow-up) -> count."""
    effects: Counter[tuple[str, int, int]] = Counter()
    for name, prefix in ((ENDPOINT, "brief."), (FOLLOWER, "debrief.")):
        for row in storage.tables.rows(bus.names.state_table(name)):
            if row.row_key.startswith(prefix):
                effects[(name, int(row.properties["n"]),  # type: ignore[arg-type]
                         int(row.properties.get("i", 0)))] += 1  # type: ignore[arg-type]
    return effects


def statistics(bus: Bus, storage: InMemoryStorage, plan: BriefPlan) -> Counter[str]:
    """What the run's Briefs went through, for the report: how many were sent, with a payload
    near what a signal carries inline, and the fan-outs near a record's limit that committed
    and that were a few bytes over it."""
    effects = _effects(bus, storage)
    fan_outs = [n for n in plan.fan_outs if n in plan.message_ids]
    return Counter(
        briefs=len(plan.message_ids),
        briefs_near_inline=sum(plan.sizes[n] == "near-inline" for n in plan.message_ids),
        fan_outs_committed=sum(bool(effects[(ENDPOINT, n, 0)]) for n in fan_outs),
        fan_outs_too_large=sum(not effects[(ENDPOINT, n, 0)] for n in fan_outs))


def check(bus: Bus, storage: InMemoryStorage, plan: BriefPlan) -> list[str]:
    """The invariants of the module's docstring, for every Brief of the run."""
    effects = _effects(bus, storage)
    left: dict[str, list[str]] = {}
    for body in storage.queues.bodies(bus.names.poison_queue(ENDPOINT)):
        entry = whole_entry(storage, body)
        if entry.envelope is not None:
            left.setdefault(entry.envelope.message_id, []).append(
                f"{entry.reason} ({entry.exception or ''})")
    violations = [f"a handler's check failed: {failure}" for failure in plan.failed_checks]
    violations += [f"{message_id} was poisoned as expired after its handler committed"
                   for message_id in sorted(set(plan.expired_after_commit))]
    for n, message_id in sorted(plan.message_ids.items()):
        copies = plan.fan_outs.get(n, (1, 0))[0]
        handled = effects[(ENDPOINT, n, 0)]
        followed = [effects[(FOLLOWER, n, i)] for i in range(copies)]
        if handled > 1 or max(followed) > 1:
            violations.append(f"brief {n}: applied {handled} times at t, its follow-ups "
                              f"{followed} times at u")
        if handled == 1 and min(followed) == 0:
            violations.append(f"brief {n}: its handler committed but follow-ups were never "
                              f"handled (committed work lost): {followed}")
        if handled == 0 and max(followed):
            violations.append(f"brief {n}: a follow-up handled without its handler's commit")
        reasons = left.get(message_id, [])
        if handled == 0 and message_id not in plan.purged and not any(
                reason in r for r in reasons for reason in (*FINAL, f"({TOO_LARGE}")):
            violations.append(f"brief {n} ({message_id}, key {plan.keys[n][:20]!r}): never "
                              "handled, neither purged nor left poisoned for good "
                              f"(entries: {reasons})")
        if handled and any(r.startswith("expired") for r in reasons):
            violations.append(f"brief {n}: an entry says expired but its handler ran")
    return violations
