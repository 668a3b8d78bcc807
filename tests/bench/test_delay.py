"""The delay proxy: bytes arrive intact and in order, each way no sooner than the delay."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from bench.delay import delayed


@pytest.fixture
def echo() -> Iterator[int]:
    """A loopback echo server's port."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def serve(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield port
    server.close()


def _exchange(port: int, payload: bytes) -> tuple[bytes, float]:
    with socket.create_connection(("127.0.0.1", port)) as conn:
        begin = time.perf_counter()
        conn.sendall(payload)
        got = b""
        while len(got) < len(payload):
            got += conn.recv(65536)
        return got, time.perf_counter() - begin


def test_every_byte_comes_back_in_order_after_the_round_trip_delay(echo: int) -> None:
    payload = bytes(range(256)) * 2000  # 512 KB: many chunks each way
    with delayed([echo], latency_ms=40) as ports:
        got, seconds = _exchange(ports[echo], payload)
    assert got == payload
    # Held 20 ms each way at least (the proxy subtracts its loop's measured oversleep, never
    # more than it measured, so the lower bound holds whatever the machine's load).
    assert seconds >= 0.040 * 0.9


def test_concurrent_connections_are_each_delayed_once_not_queued(echo: int) -> None:
    """Eight connections at once: each waits about one round trip, not eight (the proxy holds
    chunks, it does not serialize them)."""
    results: list[tuple[bytes, float]] = []
    with delayed([echo], latency_ms=200) as ports:
        threads = [threading.Thread(target=lambda i=i: results.append(
            _exchange(ports[echo], f"message {i}".encode()))) for i in range(8)]
        begin = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        total = time.perf_counter() - begin
    assert sorted(got for got, _ in results) == sorted(f"message {i}".encode() for i in range(8))
    assert all(seconds >= 0.18 for _, seconds in results)
    assert total < 8 * 0.2  # not one after another (a wide margin: 1.6 s against ~0.2 s)
