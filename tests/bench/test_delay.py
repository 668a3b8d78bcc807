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


def test_requests_are_counted_by_method_and_path_whatever_their_bodies(echo: int) -> None:
    """Bodies that look like requests (a table batch holds request lines), chunked bodies and
    a request split across writes count once each."""
    batch = b"POST /t HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello"
    requests = [
        b"GET /acct/q/messages?numofmessages=32 HTTP/1.1\r\nHost: x\r\n\r\n",
        b"POST /acct/$batch HTTP/1.1\r\nContent-Length: " + str(len(batch)).encode()
        + b"\r\n\r\n" + batch,
        b"PUT /acct/c/b HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"4\r\nGET \r\n6\r\n/x HTT\r\n0\r\n\r\n",
        b"DELETE /acct/q/messages/1?popreceipt=p HTTP/1.1\r\n\r\n",
    ]
    stream = b"".join(requests)
    with delayed([echo], latency_ms=2) as proxy:
        with socket.create_connection(("127.0.0.1", proxy[echo])) as conn:
            for start in range(0, len(stream), 7):  # in pieces that split everything
                conn.sendall(stream[start:start + 7])
            got = b""
            while len(got) < len(stream):
                got += conn.recv(65536)
        counted = proxy.requests()
    assert got == stream
    assert counted == {(echo, "GET", "/acct/q/messages?numofmessages=32"): 1,
                       (echo, "POST", "/acct/$batch"): 1, (echo, "PUT", "/acct/c/b"): 1,
                       (echo, "DELETE", "/acct/q/messages/1?popreceipt=p"): 1}
