"""The load machinery every scenario shares: a bounded in-flight window, producer and consumer
threads started together, and the clock from the first send to the last acknowledgement."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from bench import cpu
from bench.cpu import CpuUse


class BenchError(RuntimeError):
    """A scenario failed (timed out, a thread raised, or the verification found a wrong
    effect): it reports no number."""


class Flow:
    """At most ``window`` messages in flight; done after ``target`` acknowledgements.

    Producers call :meth:`before_send` (blocks while the window is full), consumers call
    :meth:`acked` once per message whose processing finished. The window keeps the queues
    shallow whatever the relative speed of producers and consumers, so a scenario measures
    the consumers at a steady depth instead of Azurite's slow deep-queue receive.
    """

    def __init__(self, target: int, window: int) -> None:
        if target < 1 or window < 1:
            raise ValueError("target and window must be at least 1")
        self.target = target
        self.window = window
        self._cond = threading.Condition()
        self._in_flight = 0
        self.completed = 0
        self.first_send: float | None = None
        self.last_ack: float | None = None
        self.done = threading.Event()

    def before_send(self, copies: int = 1, stop: threading.Event | None = None) -> bool:
        """Wait for room for ``copies`` messages; False when ``stop`` was set meanwhile."""
        with self._cond:
            while self._in_flight + copies > self.window:
                if stop is not None and stop.is_set():
                    return False
                self._cond.wait(0.1)
            self._in_flight += copies
            if self.first_send is None:
                self.first_send = time.perf_counter()
        return True

    def acked(self, count: int = 1) -> None:
        with self._cond:
            self._in_flight = max(0, self._in_flight - count)
            self.completed += count
            self.last_ack = time.perf_counter()
            if self.completed >= self.target:
                self.done.set()
            self._cond.notify_all()

    @property
    def seconds(self) -> float:
        """Wall time from the first send to the last acknowledgement."""
        if self.first_send is None or self.last_ack is None:
            return 0.0
        return self.last_ack - self.first_send


@dataclass
class ScenarioResult:
    """What one scenario measured. ``units`` are messages (or deliveries) fully processed."""

    key: str
    title: str
    units: int
    seconds: float
    verified: str
    """How the result was checked (every scenario checks before it reports)."""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.units / self.seconds if self.seconds > 0 else 0.0


def shares(total: int, parts: int) -> list[range]:
    """Split ``range(total)`` into ``parts`` interleaved shares (producer i sends i, i+p, ...),
    so that the sequence numbers in flight at any moment are close together."""
    return [range(i, total, parts) for i in range(parts)]


def run_load(flow: Flow, producers: Sequence[Callable[[threading.Event], None]],
             consumers: Sequence[Callable[[threading.Event], None]],
             timeout: float) -> CpuUse:
    """Start the consumers, then the producers; return once ``flow`` is done, with the CPU
    this process and Azurite used meanwhile.

    Each callable gets the stop event and must return soon after it is set. Raises
    BenchError when a thread raised or the flow is not done within ``timeout`` seconds.
    """
    stop = threading.Event()
    errors: list[BaseException] = []

    def guarded(fn: Callable[[threading.Event], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn(stop)
            except BaseException as exc:
                errors.append(exc)
                stop.set()
        return run

    threads = [threading.Thread(target=guarded(fn), daemon=True, name=f"consumer-{i}")
               for i, fn in enumerate(consumers)]
    threads += [threading.Thread(target=guarded(fn), daemon=True, name=f"producer-{i}")
                for i, fn in enumerate(producers)]
    begin = cpu.sample()
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    while not flow.done.wait(0.05) and not errors and time.monotonic() < deadline:
        pass
    used = CpuUse.between(begin, cpu.sample())
    stop.set()
    for thread in threads:
        thread.join(timeout=30)
    if errors:
        raise BenchError(f"a load thread raised: {errors[0]!r}") from errors[0]
    if not flow.done.is_set():
        raise BenchError(f"only {flow.completed} of {flow.target} messages were processed "
                         f"within {timeout:.0f} s")
    return used


def poll_until_stopped(poll: Callable[[], int], stop: threading.Event, idle: float,
                       idle_max: float) -> None:
    """A consumer loop: call ``poll`` (returns how many messages it handled) until stopped.

    After a poll that found nothing it sleeps ``idle`` seconds, doubling up to ``idle_max``
    while the queue stays empty (as the Functions queue trigger backs off): without it, idle
    threads' empty receives would eat the CPU the busy ones need.
    """
    pause = idle
    while not stop.is_set():
        if poll():
            pause = idle
        else:
            stop.wait(pause)
            pause = min(pause * 2, idle_max)


def progress(message: str) -> None:
    print(message, flush=True)


R = TypeVar("R")


def alternating(rounds: int, variants: Sequence[str], run: Callable[[str, int], R],
                describe: Callable[[R], str]) -> list[R]:
    """Each variant once per round, the order swapped every other round (``a, b; b, a;
    ...``), so a machine that drifts over the run weighs on both alike; progress printed
    after each run (``describe``)."""
    runs: list[R] = []
    for index in range(rounds):
        for variant in variants if index % 2 == 0 else variants[::-1]:
            done = run(variant, index)
            runs.append(done)
            progress(f"      round {index + 1} {variant}: {describe(done)}")
    return runs
