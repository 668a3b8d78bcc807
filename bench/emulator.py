"""The storage every scenario runs against: a fresh Azurite, behind the delay proxy when the
run injects Azure's latency (``BenchConfig.latency_ms``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from bench.delay import delayed
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
