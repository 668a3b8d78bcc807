"""A deterministic world: simulated workers as greenlets, one scheduler, one seeded RNG.

Every storage call is a scheduling point. There the scheduler may switch to another worker,
crash the current one, or make the call misbehave (fail before or after its effect, become a
ghost that takes effect later, duplicate a signal). It may also expire a queue lease between
steps. Time is virtual. Given the seed, a run replays exactly.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from greenlet import greenlet

from bus.adapters.memory import Fault

START_TIME = 1_800_000_000.0  # virtual epoch seconds; any fixed value works


class Crash(BaseException):
    """Raised inside a worker at a scheduling point: the process died there."""


class Stop(BaseException):
    """Raised inside a worker when the run is over."""


@dataclass(frozen=True)
class FaultProfile:
    """Probabilities for one run, drawn from its seed."""

    fail_before: float = 0.0
    fail_after: float = 0.0
    ghost: float = 0.0
    duplicate: float = 0.0
    crash: float = 0.0
    lease_expiry: float = 0.0
    stall: float = 0.0  # chance that an actor pauses before a storage call (GC, VM freeze)
    page_break: float = 0.0  # chance that a query's page ends early (or empty) on Azure
    handler_failure: float = 0.0
    ghost_delay: float = 1.0  # mean virtual seconds before a ghost request lands

    @classmethod
    def draw(cls, rng: random.Random) -> FaultProfile:
        if rng.random() < 0.1:
            return cls()  # some runs without faults: the happy path must hold too
        return cls(
            fail_before=rng.uniform(0, 0.06), fail_after=rng.uniform(0, 0.06),
            ghost=rng.uniform(0, 0.05), duplicate=rng.uniform(0, 0.25),
            crash=rng.uniform(0, 0.01), lease_expiry=rng.uniform(0, 0.01),
            handler_failure=rng.uniform(0, 0.1), ghost_delay=rng.uniform(0.01, 5.0),
            stall=rng.uniform(0, 0.01), page_break=rng.uniform(0, 0.3))


@dataclass
class Actor:
    name: str
    body: Callable[[], None]
    restart_delay: float = 1.0
    crashable: bool = True
    wake_at: float = 0.0
    finished: bool = False
    glet: greenlet | None = None
    alarm: Callable[[], bool] | None = None
    """Wakes the actor from a sleep at once when it holds (checked before every step, outside
    the faults): an alert."""
    urgent: bool = False
    """While set (``World.urgently``), the actor takes every step it can: nobody else moves
    until it sleeps (a stall, a wait) or is done."""


class Gate:
    """``threading.Event`` for actors: waiting yields to the scheduler (virtual time) instead
    of blocking the one thread every greenlet runs on (the client's send group waits on it)."""

    def __init__(self, world: World) -> None:
        self._world = world
        self._open = False

    def set(self) -> None:
        self._open = True

    def wait(self, timeout: float | None = None) -> bool:
        while not self._open:
            self._world.sleep(0.01)
        return True


@dataclass
class Counters:
    faults: dict[str, int] = field(default_factory=dict)

    def add(self, kind: str) -> None:
        self.faults[kind] = self.faults.get(kind, 0) + 1

    @property
    def total(self) -> int:
        return sum(self.faults.values())


class World:
    """The scheduler, the clock and the fault policy (it is the in-memory store's hooks)."""

    def __init__(self, seed: int, profile: FaultProfile) -> None:
        self.rng = random.Random(seed)
        self.profile = profile
        self.clock = START_TIME
        self.actors: list[Actor] = []
        self.ghosts: list[tuple[float, Callable[[], None]]] = []
        self.deaths: list[str] = []
        """Actors that died of an exception no host loop may die of (a violation each)."""
        self.counters = Counters()
        self.current: Actor | None = None
        self.steps = 0
        self._main = greenlet.getcurrent()
        self._stopping = False

    # -- FaultHooks ---------------------------------------------------------------------------
    def now(self) -> float:
        return self.clock

    def before_call(self, service: str, operation: str) -> Fault | None:
        if self.current is None:
            return None  # set-up and checks run on the main greenlet, without faults
        self._yield()
        if self.current.crashable and self.rng.random() < self.profile.crash:
            self.counters.add("crash")
            raise Crash(f"{self.current.name} crashed before {service}.{operation}")
        if self.rng.random() < self.profile.stall:
            # A paused process: everyone else goes on for up to 3 virtual seconds, then this
            # actor makes its call with whatever it read before (a slow worker).
            self.counters.add("stall")
            self.sleep(self.rng.uniform(0.0, 3.0))
        return self._draw(service, operation)

    def defer(self, effect: Callable[[], None]) -> None:
        delay = self.rng.expovariate(1.0 / self.profile.ghost_delay)
        self.ghosts.append((self.clock + delay, effect))

    # -- what actors call ---------------------------------------------------------------------
    def sleep(self, seconds: float) -> None:
        if self.current is None:
            self.clock += seconds
            return
        self.current.wake_at = self.clock + seconds
        self._yield()

    @contextmanager
    def urgently(self) -> Iterator[None]:
        """The current actor runs urgently (``Actor.urgent``) inside the block."""
        actor = self.current
        assert actor is not None
        actor.urgent = True
        try:
            yield
        finally:
            actor.urgent = False

    def page_length(self, limit: int) -> int:
        if self.current is None:
            return limit  # set-up and checks: whole answers, no draws
        if self.rng.random() < self.profile.page_break:
            self.counters.add("page_break")
            return self.rng.randint(0, min(limit - 1, 2))
        return limit

    def new_id(self) -> str:
        return f"{self.rng.getrandbits(128):032x}"

    # -- scheduling ---------------------------------------------------------------------------
    def spawn(self, actor: Actor) -> None:
        actor.wake_at = self.clock
        self.actors.append(actor)

    def run(self, quiescent: Callable[[], bool], expire_lease: Callable[[], bool],
            next_visible: Callable[[], float | None], max_steps: int) -> bool:
        """Run until ``quiescent()`` with nothing runnable; False if ``max_steps`` ran out."""
        while self.steps < max_steps:
            self.steps += 1
            self._land_due_ghosts()
            if self.rng.random() < self.profile.lease_expiry and expire_lease():
                self.counters.add("lease_expiry")
            for actor in self.actors:
                if actor.alarm is not None and actor.wake_at > self.clock and actor.alarm():
                    actor.wake_at = self.clock
            runnable = [a for a in self.actors if not a.finished and a.wake_at <= self.clock]
            if runnable:
                urgent = [a for a in runnable if a.urgent]
                self._step(urgent[0] if urgent else self.rng.choice(runnable))
                self.clock += self.rng.uniform(0.0005, 0.005)
                continue
            if quiescent():
                if not self.ghosts:
                    return True
                # Idle workers keep making ghosts (of empty receives): land what is pending
                # now - an earlier landing is just a shorter delay - and look again.
                for _, effect in self.ghosts:
                    effect()
                self.ghosts.clear()
                continue
            self.clock = self._next_wake(next_visible())
        return False

    def stop(self) -> None:
        self._stopping = True
        for actor in self.actors:
            if actor.glet is not None and not actor.glet.dead:
                actor.glet.switch()

    def _step(self, actor: Actor) -> None:
        if actor.glet is None or actor.glet.dead:
            actor.glet = greenlet(self._life(actor))
        self.current = actor
        actor.glet.switch()
        self.current = None

    def _life(self, actor: Actor) -> Callable[[], None]:
        def live() -> None:
            try:
                while True:
                    try:
                        actor.body()
                        actor.finished = True
                        return
                    except Crash:
                        actor.wake_at = self.clock + actor.restart_delay
                        self._yield()
            except Stop:
                return
            except Exception as exc:  # a bug: the run goes on without the actor, and fails
                self.deaths.append(f"{actor.name} died: {type(exc).__name__}: {exc}"[:300])
                actor.finished = True

        return live

    def _yield(self) -> None:
        self._main.switch()
        if self._stopping:
            raise Stop()

    def _next_wake(self, visible: float | None) -> float:
        times = [a.wake_at for a in self.actors if not a.finished]
        times.extend(due for due, _ in self.ghosts)
        if visible is not None:
            times.append(visible)
        later = [t for t in times if t > self.clock]
        return min(later) if later else self.clock + 1.0

    def _land_due_ghosts(self) -> None:
        due = [g for g in self.ghosts if g[0] <= self.clock]
        for ghost in due:
            self.ghosts.remove(ghost)
            ghost[1]()

    def _draw(self, service: str, operation: str) -> Fault | None:
        p = self.profile
        roll = self.rng.random()
        for fault, chance in ((Fault.FAIL_BEFORE, p.fail_before),
                              (Fault.FAIL_AFTER, p.fail_after), (Fault.GHOST, p.ghost)):
            if roll < chance:
                self.counters.add(f"{fault.value}:{service}")
                return fault
            roll -= chance
        if service == "queue" and operation == "send" and self.rng.random() < p.duplicate:
            self.counters.add("duplicate_signal")
            return Fault.DUPLICATE
        return None
