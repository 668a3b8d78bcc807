"""``python -m bus worker``: an app's endpoints run by polling workers, outside Functions.

Each endpoint gets a ``bus.hosting.worker.Worker`` (the host the benchmarks and the tests
use: the same settlement as the Functions trigger, its own polling). Maintenance
(``bus.hosting.maintenance``) runs beside them every ``MAINTENANCE_SECONDS``, as the Functions
app's timer does.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

from bus.bus import Bus
from bus.hosting.maintenance import maintenance_pass
from bus.hosting.worker import Worker

log = logging.getLogger(__name__)

MAINTENANCE_SECONDS = 300.0
MAX_ROUNDS = 10_000
"""``until_idle`` gives up after this many rounds that each found work (a loop of messages
that keep sending each other)."""


class StillBusy(Exception):
    """``until_idle`` found work in every one of ``MAX_ROUNDS`` rounds."""


def until_idle(bus: Bus, workers: Mapping[str, Worker]) -> dict[str, dict[str, int]]:
    """Poll every worker, round after round, until a round finds nothing anywhere; then one
    maintenance pass, and again until idle. What became of the messages, per endpoint. A
    message whose retry delays it is not waited for (it is handled by a later run). Raises
    ``StorageError`` when storage does not answer at the start (a poll that fails finds
    nothing, which is not idle)."""
    for worker in workers.values():
        bus.storage.queues.depth(worker.queue)
    for _ in range(2):
        for _ in range(MAX_ROUNDS):
            if not sum(worker.poll_once() for worker in workers.values()):
                break
        else:
            raise StillBusy(f"still busy after {MAX_ROUNDS} rounds of polling: messages keep "
                            "coming (handlers that keep sending each other?); run the "
                            "worker without --until-idle")
        maintenance_pass(bus)
    return {name: dict(worker.outcomes) for name, worker in workers.items()}


def until_stopped(bus: Bus, workers: Mapping[str, Worker],
                  stop: threading.Event | None = None) -> None:
    """Run every worker on a thread of its own, and maintenance on this one, until ``stop``
    is set or Ctrl-C."""
    stop = stop or threading.Event()
    threads = [threading.Thread(target=worker.run, args=(stop,), name=f"worker-{name}",
                                daemon=True) for name, worker in workers.items()]
    for thread in threads:
        thread.start()
    try:
        while not stop.is_set():
            report = maintenance_pass(bus)
            log.info("maintenance: %s", report)
            stop.wait(MAINTENANCE_SECONDS)
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        for thread in threads:
            thread.join()
