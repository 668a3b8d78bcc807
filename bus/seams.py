"""What the simulation and time-travelling tests replace in a Bus: its clock, its ids, its
sleeps and random draws, its safeguards and what concurrent senders wait on.

They are not part of ``Bus``'s constructor: ``bus.testing.seamed_bus(Seams(clock=...), ...)``
builds a bus with them, so that a run of ``bus.testing.simulate`` replays exactly from its
seed, a test can move time by days, and a safeguard can be switched off to show that it is
needed (``bus.protocol.safeguards``).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field

from bus.groups import Gate
from bus.ids import IdFactory, random_id
from bus.protocol.safeguards import Safeguards


@dataclass(frozen=True)
class Seams:
    """What a test replaces; every default is what production uses."""

    clock: Callable[[], float] = time.time
    new_id: IdFactory = random_id
    sleep: Callable[[float], None] = time.sleep
    random: Callable[[], float] = random.random
    safeguards: Safeguards = field(default_factory=Safeguards)
    gate: Callable[[], Gate] = threading.Event
    """What a sender waits on while another flushes its group (``bus.protocol.send.group``)."""
    pool: Callable[[int], Executor] = field(default=lambda workers: ThreadPoolExecutor(
        max_workers=workers, thread_name_prefix="bus-send"))
    """Where ``send_many`` runs up to that many sends at once (the simulation's actors share
    one thread: there, one after another)."""
    shard_run: int = 100
    """Attempt ids made in a row for one token shard before the next
    (``bus.protocol.tokens.shards``; the simulation moves on sooner, to mix shards)."""
    lanes: Callable[[int], Executor] = field(default=lambda workers: ThreadPoolExecutor(
        max_workers=workers, thread_name_prefix="bus-round"))
    """Where a claim round runs up to that many independent requests at once
    (``bus.protocol.receive.lanes``; in the simulation, one after another)."""
