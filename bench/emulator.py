"""The storage every scenario runs against: a fresh Azurite, behind the delay proxy when the
run injects Azure's latency (``BenchConfig.latency_ms``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from bench.delay import delayed, round_trip_ms
from devhost.azurite import Azurite, connection_string


@contextlib.contextmanager
def azurite(latency_ms: float) -> Iterator[str]:
    """Yield a connection string to a fresh in-memory Azurite whose every request takes
    ``latency_ms`` longer (0: direct); stop both afterwards."""
    emulator = Azurite()
    try:
        direct = emulator.start()
        if latency_ms <= 0:
            yield direct
            return
        with delayed(emulator.ports, latency_ms) as ports:
            yield connection_string(*(ports[port] for port in emulator.ports))
    finally:
        emulator.stop()


def round_trips(latency_ms: float) -> tuple[float, float]:
    """The median round trip of a tiny queue-service request to a fresh Azurite, in ms: direct,
    and through the delay proxy adding ``latency_ms`` (what the results file reports beside
    the setting, since the proxy's timer is only as exact as the event loop's)."""
    emulator = Azurite()
    try:
        emulator.start()
        queue = emulator.ports[1]
        direct = round_trip_ms(queue)
        with delayed([queue], latency_ms) as ports:
            proxied = round_trip_ms(ports[queue])
        return direct, proxied
    finally:
        emulator.stop()
