"""``eobus.queue.depth``: each hosted endpoint's queue length, read rarely.

Monitoring that reads storage costs requests and, read too often, throttles the account it
watches. One gauge per ``Telemetry``; hosts register the queues they serve (``QueueDepths``).
On each collection the gauge reads a queue's length (one request) only when its last reading
is older than the host's interval (``Settings.queue_depth_seconds``), and otherwise reports that
reading: one request per queue per interval, whatever the collection interval and however
many hosts of the process serve the queue.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from bus.observability import conventions as sc
from bus.storage import Queues, StorageError

log = logging.getLogger(__name__)


@dataclass(eq=False)
class QueueDepths:
    """The queues one host serves: ``queues`` maps each endpoint to its queue's name. Held by
    the host; the gauge forgets it once the host is gone."""

    port: Queues
    queues: Mapping[str, str]
    interval: float
    clock: Callable[[], float]


@dataclass
class _Reading:
    depth: int
    at: float


@dataclass
class DepthGauge:
    meter: Meter
    _hosts: weakref.WeakSet[QueueDepths] = field(default_factory=weakref.WeakSet)
    _readings: dict[tuple[int, str], _Reading] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.meter.create_observable_gauge(
            "eobus.queue.depth", callbacks=[self._observe], unit="{message}",
            description="Approximate messages in an endpoint's queue, visible or not")

    def watch(self, depths: QueueDepths) -> None:
        with self._lock:
            self._hosts.add(depths)

    def _observe(self, options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            hosts = list(self._hosts)
        seen: set[tuple[int, str]] = set()
        for host in hosts:
            for endpoint, queue in host.queues.items():
                key = (id(host.port), queue)
                if key in seen:
                    continue
                seen.add(key)
                reading = self._reading(host, key, queue)
                if reading is not None:
                    yield Observation(reading.depth, {sc.MESSAGING_SYSTEM: sc.SYSTEM,
                                                      sc.DESTINATION: endpoint})

    def _reading(self, host: QueueDepths, key: tuple[int, str], queue: str) -> _Reading | None:
        now = host.clock()
        last = self._readings.get(key)
        if last is not None and now - last.at < host.interval:
            return last
        try:
            reading = _Reading(host.port.depth(queue), now)
        except StorageError as exc:  # reported once more at the next collection
            log.info("could not read the length of %s: %s", queue, exc)
            return last
        self._readings[key] = reading
        return reading
