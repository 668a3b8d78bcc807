"""Back-pressure: bounded endpoint queues and a bound on sends in flight.

An endpoint can declare ``Endpoint(..., max_queue_depth=N)`` (or a sender can be told about an
endpoint it does not define: ``Bus(..., max_queue_depths={"billing": N})``). Before a signal
goes to such a queue the courier looks at its approximate depth; at or above the limit the
send is refused with :class:`QueueFull`:

* from a handler, the commit has happened and the copy's token exists: the record waits in the
  outbox (phase SENDING) and the incoming message is released, so its next delivery - or the
  maintenance timer - sends the signal once there is room. Nothing is lost, nothing doubles.
* from ``Bus.send``, the check happens before anything is written: the caller gets the error
  and nothing was sent. ``Bus.send_once`` keeps the message in its ledger (its outbox); calling
  it again later sends it.

The depth is the queue's approximate message count, read at most once per
``Settings.depth_check_seconds`` per queue and process, so a burst may overshoot the limit by
what arrives within that window: the bound protects the system from runaway queues, it is not
an exact quota. A bundle (``bus.protocol.copies.bundles``) is one queue message however many signals
it carries (at most ``MAX_PARTS``), so a queue of bundles holds more signals than its depth
says; for an exact bound in signals, turn bundles off (``Settings.signal_bundles``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

from bus.errors import QueueFull
from bus.naming import Names
from bus.storage import Queues


class Room:
    """Answers "may a signal go to this endpoint now?" from cached queue depths."""

    def __init__(self, *, queues: Queues, names: Names, limits: Mapping[str, int],
                 clock: Callable[[], float], ttl: float) -> None:
        self._queues = queues
        self._names = names
        self._limits = dict(limits)
        self._clock = clock
        self._ttl = ttl
        self._depths: dict[str, tuple[float, int]] = {}
        self._lock = threading.Lock()

    def check(self, destination: str) -> None:
        """Raise QueueFull when ``destination`` has a limit and its queue is at it."""
        limit = self._limits.get(destination)
        if limit is None:
            return
        depth = self._depth(destination)
        if depth >= limit:
            raise QueueFull(destination, depth, limit)

    def _depth(self, destination: str) -> int:
        now = self._clock()
        with self._lock:
            cached = self._depths.get(destination)
        if cached is not None and now - cached[0] < self._ttl:
            return cached[1]
        depth = self._queues.depth(self._names.queue(destination))
        with self._lock:
            self._depths[destination] = (now, depth)
        return depth
