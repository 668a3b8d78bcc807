"""Running a claim round's independent storage requests side by side.

A round (``bus.protocol.receive.receiver``) holds at most one claim per state partition, so its
slot loads (R3) touch different partitions, its commits (R6) different slots, and its
acknowledgements different queue messages: none waits for another's result. One after another
they cost a round trip each - about 1 ms to Azurite on loopback, 5-10 ms to Azure Storage - and
a round of 30 claims spends most of its time waiting. :class:`Lanes` runs such a list of tasks
on a shared pool, at most ``width`` at once, and returns their results in the list's order, so
the receiver goes on exactly as if it had run them one after another.

Why that keeps exactly-once: the protocol never relies on the order of two requests of one
round - each claim's safety comes from its own slot's compare-and-swap and its own token,
and two actors' requests already interleave in any order (docs/protocol.md, "Concurrency
inside a round"). The simulation's pool runs each task when it is submitted, in list order
(its actors share one thread), which is one of the orders the pool can produce.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, wait
from typing import TypeVar

T = TypeVar("T")


class Lanes:
    """Up to ``width`` tasks of one list at once on a pool made on first use."""

    def __init__(self, pool: Callable[[int], Executor], width: int) -> None:
        if width < 1:
            raise ValueError("width must be at least 1")
        self.width = width
        self._make = pool
        self._pool: Executor | None = None
        self._lock = threading.Lock()

    def run(self, tasks: Sequence[Callable[[], T]]) -> list[T]:
        """Each task's result, in order. A task should catch what it expects: one that raises
        makes ``run`` raise the first such error (in list order) once every task ended."""
        if len(tasks) <= 1 or self.width == 1:
            return [task() for task in tasks]
        pool = self._executor()
        futures = [pool.submit(task) for task in tasks]
        wait(futures)  # all of them, even when one failed: nothing of the round runs on
        return [future.result() for future in futures]

    def _executor(self) -> Executor:
        with self._lock:
            if self._pool is None:
                self._pool = self._make(self.width)
            return self._pool
