"""The simulated application: five endpoints, commands, an event with two subscribers.

    client --Start--> a --Step--> b ==Happened==> c  (may defer it; e or a releaser
                                               => d --Finish--> e  releases it)
                                          c --Noted--> e  (on every run of c's handler,
                                                           deferring ones too, in some runs)

In half of the runs a sixth endpoint, ``s``, handles ``Tally`` in sessions: ``e`` (and in some
runs ``b``) sends numbered Tallies to the sessions from its partitions, and the client sends
some too (numbered with ``send``, in arrival order with ``send_once``); see ``SessionPlan``.

Every handler records its effect as a row with a unique key (so applying an effect twice leaves
two rows, even if the two commits raced) and bumps a per-partition counter with a
read-modify-write (so a lost update shows as a counter that disagrees with the effect rows).
Some Start and Step messages carry a payload too large for a queue message (claim check).
Contracts evolve as in a rolling deploy: an older release of ``a`` sends Step under its old
name and shape (``Marched``: an alias, upcast at ``b``), a newer release of ``d`` sends Finish
with a field ``e`` does not know yet (ignored).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from bus import Command, Context, Endpoint, Event
from bus.messages import Message
from bus.retry import Abandon, Reject, RetryAfter, RetryPolicy

ENDPOINTS = ("a", "b", "c", "d", "e")
EXPECTED = (("a", "Start"), ("b", "Step"), ("c", "Happened"), ("d", "Happened"),
            ("e", "Finish"))
LARGE = 50_000


class Start(Command):
    root: int
    pad: str = ""


class Step(Command):
    """Renamed from ``Marched`` (an older ``a`` still sends that, with ``number`` for
    ``root``): received as it was sent, upcast into this contract."""

    aliases: ClassVar[tuple[str, ...]] = ("Marched",)
    root: int
    pad: str = ""

    @classmethod
    def upcast(cls, data: dict[str, Any], sent_as: str) -> dict[str, Any]:
        if sent_as == "Marched":
            data["root"] = data.pop("number")
        return data


class Marched(Command):
    """``Step`` as an older release of ``a`` sends it, for odd roots."""

    number: int
    pad: str = ""


class Happened(Event):
    root: int


class Finish(Command):
    root: int


class FinishAhead(Command):
    """``Finish`` as a newer release of ``d`` sends it, for every third root: a field ``e``'s
    contract does not know yet, which it ignores."""

    message_type: ClassVar[str] = "Finish"
    root: int
    rush: bool = True


class Tally(Command):
    """A message of session ``session`` at ``s``; ``label`` names it among the run's
    messages (who sent it, for which root, which one)."""

    session: str
    label: str


class Noted(Command):
    """What ``c`` sends on every run of its handler: each run's record, deferring ones too,
    has an outgoing message, so one message id (the event's) comes back to ``c``'s slot with
    records to dispatch, by an orchestration when they are handed off."""

    root: int
    generation: int


@dataclass(frozen=True)
class Knobs:
    partitions: int
    handler_failure: float
    immediate: int = 1  # handler attempts per delivery (immediate retries)
    retry_after: float = 0.0  # chance that a handler asks for a delayed retry instead
    scheduled: float = 0.0  # chance that Finish is sent with a delay (scheduled delivery)
    bounded: int | None = None  # max queue depth of b and e (back-pressure), None: unbounded
    defer: float = 0.0  # chance that c defers a Happened (released by e, or by a releaser)
    deferrals: int = 1  # how many times c may defer one Happened (again after a release)
    declared_reads: bool = False  # handlers declare the counter row (read with the claim)
    noted: bool = False  # c sends Noted to e on every run of its handler
    sessions: SessionPlan | None = None  # endpoint s and its Tallies, in half of the runs


@dataclass
class SessionPlan:
    """The sessions of a run: their keys, who sends each how many Tallies, how ``s`` treats
    gaps. Each root's Finish makes ``e`` send ``per_root`` Tallies to one session (a stream per
    partition of ``e``, numbered within a commit and across the commits of the roots that share
    the partition: ``e`` sends nothing else, so the fan-out leaves the other endpoints' records
    as they were); with ``from_b``, each root's Step makes ``b`` send one to another session;
    the client sends ``from_client`` to every session. ``settle`` completes it once the roots
    are drawn."""

    keys: tuple[str, ...]
    partitions: int  # state partitions at s: sessions share them
    per_root: int
    from_b: bool
    from_client: int
    close: bool  # the handler closes a session on its last Tally
    skip_gaps: bool
    window: float  # s's reorder window, seconds
    doomed: str | None = None  # the label of a Tally its handler always rejects
    totals: dict[str, int] = field(default_factory=dict)
    operator: bool = False
    """An operator at the console (``bus.testing.simulate.console``) skips the sessions a gap
    holds up and skips or closes others at random: the client then numbers its Tallies even
    to an endpoint that blocks (a gap a failed send leaves is the operator's to skip)."""
    bounded: int | None = None  # s's max queue depth (back-pressure), with an operator
    skipped_by_operator: set[str] = field(default_factory=set)
    """Sessions the operator asked to skip (recorded before it asks: the request may have
    taken effect even when it raised)."""
    closed_by_operator: set[str] = field(default_factory=set)
    numbering_failed: set[str] = field(default_factory=set)
    """Sessions one of whose numbered client sends raised a storage error: its number may be
    lost (a gap in the client's stream). A send refused with QueueFull took none."""
    purged: dict[str, tuple[str, str | None, int | None]] = field(default_factory=dict)
    """The Tallies whose poison entries the operator purged: label -> session, stream and
    number."""

    def partition(self, key: str) -> str:
        return f"q{self.keys.index(key) % self.partitions}"

    def session_of(self, root: int, offset: int = 0) -> str:
        return self.keys[(root + offset) % len(self.keys)]

    def from_e(self, root: int) -> dict[str, str]:
        """The Tallies e's handler sends for ``root``, label -> session."""
        key = self.session_of(root)
        return {f"e-{root}-{key}-{i}": key for i in range(self.per_root)}

    def labels(self, roots: int) -> dict[str, str]:
        """Every Tally of the run, label -> session."""
        labels = {label: key for root in range(roots) for label, key in self.from_e(root).items()}
        if self.from_b:
            labels.update({f"b-{root}": self.session_of(root, 1) for root in range(roots)})
        labels.update(self.client_labels())
        return labels

    def client_labels(self) -> dict[str, str]:
        return {f"client-{key}-{i}": key for key in self.keys for i in range(self.from_client)}

    def settle(self, roots: int, once: bool) -> None:
        """The rest of the plan once the roots and the client's way of sending are drawn: a
        client with ``send`` sends numbered Tallies only to an endpoint that skips gaps (a
        number it took for a send that then failed is a gap: one that blocks, by design, at
        an endpoint that does not); and ``totals``, how many Tallies each session gets."""
        if not once and not self.skip_gaps and not self.operator:
            self.from_client = 0
        self.totals = {key: 0 for key in self.keys}
        for key in self.labels(roots).values():
            self.totals[key] += 1


@dataclass
class Releases:
    """Who may release which of ``c``'s deferrals. Its first is ``e``'s to release (Finish's
    handler asks for it); any one is the operator's, recorded here before it releases it. So a
    run of ``c``'s handler after a later deferral the operator did not release shows a release
    request that released a deferral it was not for.

    With ``explicit``, ``e``'s request names the first deferral (``deferrals=0``). Without,
    it is for the deferral ``e``'s handler sees, so the operator leaves a first deferral to
    ``e`` until ``e`` has handled Finish: ``e`` then never sees a later one."""

    explicit: bool = True
    permitted: set[tuple[int, int]] = field(default_factory=set)
    violations: list[str] = field(default_factory=list)

    def check(self, root: int, deferrals: int) -> None:
        """A run of ``c``'s handler after ``deferrals`` releases of the message of ``root``."""
        if deferrals >= 2 and (root, deferrals - 1) not in self.permitted:
            self.violations.append(f"root {root}: deferral {deferrals - 1} at c released "
                                   "without a release asked for it")


def retry_policy(knobs: Knobs) -> RetryPolicy:
    """Every endpoint's retry policy in a run."""
    return RetryPolicy(immediate=knobs.immediate, backoff_initial=0.01, delays=(0.1, 0.5))


def build(knobs: Knobs, roll: Callable[[], float], new_id: Callable[[], str],
          releases: Releases | None = None) -> list[Endpoint]:
    policy = retry_policy(knobs)
    endpoints = {name: Endpoint(name, retry=policy,
                                max_queue_depth=knobs.bounded if name in "be" else None)
                 for name in ENDPOINTS}

    def partition(message: Start | Step | Happened | Finish | Noted) -> str:
        return f"p{message.root % knobs.partitions}"

    reads = (lambda message: ["counter"]) if knobs.declared_reads else None

    def effect(ctx: Context, message: Message, root: int, kind: str | None = None) -> None:
        if roll() < knobs.handler_failure:
            raise RuntimeError("injected handler failure")
        if roll() < knobs.retry_after:
            raise RetryAfter(roll(), "injected: try later")
        if roll() < knobs.retry_after:
            raise Abandon("injected: abandoned")
        kind = kind or message.message_type
        ctx.state.put(f"fx.{root}.{kind}.{new_id()}", {"root": root, "type": kind})
        counter = ctx.state.get("counter") or {"n": 0}
        n = counter["n"]
        assert isinstance(n, int)
        ctx.state.put("counter", {"n": n + 1})
        if roll() < knobs.handler_failure:  # after writing: an attempt must leave nothing
            raise RuntimeError("injected handler failure after its writes")

    @endpoints["a"].handles(Start, partition=partition, reads=reads)
    def on_start(message: Start, ctx: Context) -> None:
        effect(ctx, message, message.root)
        _send_step(ctx, message)
        if roll() < knobs.handler_failure:  # after sending: the send must not happen either
            raise RuntimeError("injected handler failure after its send")

    @endpoints["b"].handles(Step, partition=partition, reads=reads)
    def on_step(message: Step, ctx: Context) -> None:
        effect(ctx, message, message.root)
        ctx.publish(Happened(root=message.root))
        _send_tallies(ctx, knobs.sessions, "b", message.root)

    @endpoints["c"].handles(Happened, partition=partition, reads=reads)
    def on_happened_c(message: Happened, ctx: Context) -> None:
        if releases is not None:
            releases.check(message.root, ctx.deferrals)
        if knobs.noted:  # the same message id each run: the event's, position 0
            ctx.send(Noted(root=message.root, generation=ctx.deferrals))
        if ctx.deferrals < knobs.deferrals and roll() < knobs.defer:
            # Deferral commits with state: a unique row, so a deferral applied twice shows.
            ctx.state.put(f"wait.{message.root}.{new_id()}",
                          {"root": message.root, "generation": ctx.deferrals})
            ctx.defer()
            return
        effect(ctx, message, message.root)

    @endpoints["d"].handles(Happened, partition=partition, reads=reads)
    def on_happened_d(message: Happened, ctx: Context) -> None:
        effect(ctx, message, message.root)
        # Scheduled delivery. (Delays beyond the queue's 7 days are tested with a fake clock in
        # tests/protocol/test_scheduling.py: idle workers poll every 0.5 virtual s, too many
        # steps here.)
        delay = roll() * 3.0 if roll() < knobs.scheduled else 0.0
        ctx.send(_finish(message.root), delay=delay, headers={"happened": ctx.message_id})

    @endpoints["e"].handles(Noted, partition=partition, reads=reads)
    def on_noted(message: Noted, ctx: Context) -> None:
        # One effect per run of c's handler: its type names the run's generation.
        effect(ctx, message, message.root, f"Noted{message.generation}")

    @endpoints["e"].handles(Finish, partition=partition, reads=reads)
    def on_finish(message: Finish, ctx: Context) -> None:
        effect(ctx, message, message.root)
        _send_tallies(ctx, knobs.sessions, "e", message.root)
        if knobs.defer:  # c's copy of the event may be deferred (or not yet, or never)
            first = 0 if releases is None or releases.explicit else None
            ctx.release_deferred(ctx.headers["happened"], endpoint="c", deferrals=first)

    endpoints.update(_tallying(knobs, policy, roll, new_id))
    return list(endpoints.values())


def _send_step(ctx: Context, start: Start) -> None:
    if start.root % 2:  # from an older release of a, still deployed
        ctx.send(Marched(number=start.root, pad=start.pad), to="b")
    else:
        ctx.send(Step(root=start.root, pad=start.pad))


def _finish(root: int) -> Finish | FinishAhead:
    return FinishAhead(root=root) if root % 3 == 0 else Finish(root=root)  # a newer release of d


def _send_tallies(ctx: Context, plan: SessionPlan | None, sender: str, root: int) -> None:
    """The Tallies e's handler sends for ``root``, or b's (one, with ``from_b``): numbered in
    the stream of the handler's partition."""
    if plan is None:
        return
    if sender == "e":
        for label, key in plan.from_e(root).items():
            ctx.send(Tally(session=key, label=label))
    elif plan.from_b:
        ctx.send(Tally(session=plan.session_of(root, 1), label=f"b-{root}"))


def _tallying(knobs: Knobs, policy: RetryPolicy, roll: Callable[[], float],
              new_id: Callable[[], str]) -> dict[str, Endpoint]:
    """Endpoint ``s``, in a run with sessions. Its handler writes one effect row per Tally
    naming its stream, its sequence number and the number the session had handled last in
    that stream (so the order of the commits shows), and keeps the session's state (a count,
    the last number per stream) in step."""
    plan = knobs.sessions
    if plan is None:
        return {}
    endpoint = Endpoint("s", retry=policy, reorder_window=plan.window, skip_gaps=plan.skip_gaps,
                        max_queue_depth=plan.bounded)
    reads = (lambda message: ["counter"]) if knobs.declared_reads else None

    @endpoint.handles(Tally, partition=lambda m: plan.partition(m.session), reads=reads,
                      session=lambda m: m.session)
    def on_tally(message: Tally, ctx: Context) -> None:
        if message.label == plan.doomed:
            raise Reject("injected: this Tally can never succeed")
        if roll() < knobs.handler_failure:
            raise RuntimeError("injected handler failure")
        if roll() < knobs.retry_after:
            raise RetryAfter(roll(), "injected: try later")
        if roll() < knobs.retry_after:
            raise Abandon("injected: abandoned")
        session = ctx.session
        assert session is not None
        stream, sequence = ctx.envelope.stream, ctx.envelope.sequence
        last: dict[str, int] = dict(session.state.get("last", {}))
        count = int(session.state.get("count", 0)) + 1
        ctx.state.put(f"tally.{message.label}.{new_id()}", {
            "session": message.session, "label": message.label, "stream": stream or "",
            "sequence": sequence or 0, "prev": last.get(stream, 0) if stream else 0,
            "generation": ctx.deferrals, "count": count})
        counter = ctx.state.get("counter") or {"n": 0}
        n = counter["n"]
        assert isinstance(n, int)
        ctx.state.put("counter", {"n": n + 1})
        if stream is not None and sequence is not None:
            last[stream] = sequence
        session.state.update(last=last, count=count)
        if plan.close and count == plan.totals[message.session]:
            session.close()
        if roll() < knobs.handler_failure:  # after writing: an attempt must leave nothing
            raise RuntimeError("injected handler failure after its writes")

    return {"s": endpoint}
