"""A loopback TCP proxy that holds every chunk for a fixed time each way: Azure's latency put
between a benchmark and Azurite.

A request to Azure Storage from a function in the same region takes about 5-10 ms end to end;
to Azurite on loopback about 1 ms. Requests one after another that look free locally are what
limits throughput in Azure, and a benchmark without the latency cannot show it (nor whether
running a round's requests concurrently helps). With ``--delay-ms d`` each chunk of bytes is
forwarded ``d`` ms after it arrived, in order, in both directions: a request on a kept-alive
connection waits ``2 d`` ms more for its response than it would without the proxy.

    python -m bench.delay --delay-ms 2.5 TARGET_PORT [...]

listens on a port of its own choosing in front of each target (chosen by binding, so no other
process can take it between choosing and listening), prints ``ready`` and one JSON object,
target port -> listening port, once every one accepts, and runs until terminated; on SIGUSR1 it
prints one JSON line: the HTTP requests clients sent through it so far, by listening port,
method and path (:class:`Requests`), for processes the benchmark cannot count from inside (the
Functions worker). It is its own
process, so its work does not share the measured Python process's interpreter lock (it shares
the machine's cores, as Azurite does). Connections are held on both sides as the client opens
them: the SDKs' connection pools (10 per service client) behave as they would against Azure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence

CHUNK = 1 << 16


class Requests:
    """Counts the HTTP/1.1 requests in one client-to-server byte stream: a request line and
    headers, then a body of ``Content-Length`` bytes (or chunked); what the bytes say is
    never changed."""

    def __init__(self, record: Callable[[str, str], None]) -> None:
        self._record = record
        self._buffer = b""
        self._body = 0  # body bytes still to skip
        self._chunked = False

    def feed(self, data: bytes) -> None:
        self._buffer += data
        while self._step():
            pass

    def _step(self) -> bool:
        if self._chunked:
            return self._chunk()
        if self._body:
            skipped = min(self._body, len(self._buffer))
            self._body -= skipped
            self._buffer = self._buffer[skipped:]
            return bool(self._buffer) and not self._body
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            return False
        head, self._buffer = self._buffer[:end].decode("latin-1"), self._buffer[end + 4:]
        line, *fields = head.split("\r\n")
        method, _, rest = line.partition(" ")
        self._record(method, rest.rpartition(" ")[0])
        headers = {name.strip().lower(): value.strip()
                   for name, _, value in (f.partition(":") for f in fields)}
        self._chunked = headers.get("transfer-encoding", "").lower() == "chunked"
        self._body = int(headers.get("content-length", "0") or 0)
        return True

    def _chunk(self) -> bool:
        """Skip one chunk of a chunked body; the last (size 0) ends it."""
        end = self._buffer.find(b"\r\n")
        if end < 0:
            return False
        size = int(self._buffer[:end].split(b";")[0], 16)
        if size == 0:
            close = self._buffer.find(b"\r\n\r\n", end)
            if close < 0:
                return False
            self._buffer, self._chunked = self._buffer[close + 4:], False
            return True
        if len(self._buffer) < end + 2 + size + 2:
            return False
        self._buffer = self._buffer[end + 2 + size + 2:]
        return True


async def _forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                   delay: float, requests: Requests | None = None) -> None:
    """Copy ``reader`` to ``writer``, each chunk ``delay`` seconds after it was read, in order.

    Reading goes on while earlier chunks wait, so the delay is added once per chunk, not
    once per chunk behind it (a pipe's latency, not its bandwidth)."""
    loop = asyncio.get_running_loop()
    held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def read() -> None:
        try:
            while data := await reader.read(CHUNK):
                held.put_nowait((loop.time() + delay, data))
                if requests is not None:
                    requests.feed(data)
        except (ConnectionError, OSError):
            pass
        held.put_nowait((loop.time() + delay, b""))

    reading = asyncio.create_task(read())  # referenced until the copy ends
    try:
        while True:
            due, data = await held.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        reading.cancel()
        with contextlib.suppress(Exception):
            if writer.can_write_eof():
                writer.write_eof()


async def _connection(client_reader: asyncio.StreamReader,
                      client_writer: asyncio.StreamWriter, target: int, delay: float,
                      requests: Requests) -> None:
    try:
        server_reader, server_writer = await asyncio.open_connection("127.0.0.1", target)
    except OSError:
        client_writer.close()
        return
    for writer in (client_writer, server_writer):
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        await asyncio.gather(_forward(client_reader, server_writer, delay, requests),
                             _forward(server_reader, client_writer, delay))
    finally:
        for writer in (client_writer, server_writer):
            writer.close()


async def _overshoot(delay: float, tries: int = 40) -> float:
    """How much later than asked ``asyncio.sleep(delay)`` returns here, on average: the event
    loop rounds its timeouts up to whole milliseconds, which would add about 1 ms to every
    chunk's hold."""
    loop = asyncio.get_running_loop()
    late = 0.0
    for _ in range(tries):
        begin = loop.time()
        await asyncio.sleep(delay)
        late += loop.time() - begin - delay
    return late / tries


async def serve(targets: Sequence[int], delay: float) -> None:
    """Listen on a free loopback port in front of each target port, forwarding to it, until
    cancelled. Each chunk is held ``delay`` seconds, less the event loop's measured
    oversleep."""
    if delay > 0:
        delay = max(0.0, delay - await _overshoot(delay))
    servers = []
    live: set[asyncio.Task[None]] = set()  # the loop keeps only weak references to tasks
    counts: dict[str, int] = {}

    def report() -> None:
        print(json.dumps(counts), flush=True)

    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, report)
    listening: dict[int, int] = {}
    for target in targets:
        def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                   target: int = target) -> None:
            def record(method: str, path: str) -> None:
                key = f"{listening[target]} {method} {path}"
                counts[key] = counts.get(key, 0) + 1

            task = asyncio.create_task(_connection(reader, writer, target, delay,
                                                   Requests(record)))
            live.add(task)
            task.add_done_callback(live.discard)
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        servers.append(server)
        listening[target] = int(server.sockets[0].getsockname()[1])
    print("ready", json.dumps(listening), flush=True)
    await asyncio.gather(*(server.serve_forever() for server in servers))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.delay", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--delay-ms", type=float, required=True,
                        help="milliseconds each chunk is held, each way")
    parser.add_argument("targets", nargs="+", type=int, metavar="TARGET_PORT")
    args = parser.parse_args(argv)
    # Terminated between two runs: nothing to flush or close, the connections go with it.
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.targets, args.delay_ms / 1000))


class Proxy(dict[int, int]):
    """A running proxy: target port -> the port to use instead."""

    def __init__(self, routes: dict[int, int], process: subprocess.Popen[str]) -> None:
        super().__init__(routes)
        self._process = process

    def requests(self) -> dict[tuple[int, str, str], int]:
        """The HTTP requests sent through the proxy so far, by (target port, method, path)."""
        assert self._process.stdout is not None
        self._process.send_signal(signal.SIGUSR1)
        line = self._process.stdout.readline()
        listen_to_target = {listen: target for target, listen in self.items()}
        counts: dict[tuple[int, str, str], int] = {}
        for key, n in json.loads(line).items():
            listen, method, path = key.split(" ", 2)
            counts[(listen_to_target[int(listen)], method, path)] = n
        return counts


@contextlib.contextmanager
def delayed(targets: Sequence[int], latency_ms: float) -> Iterator[Proxy]:
    """A proxy process in front of each of ``targets`` adding ``latency_ms`` to every request's
    round trip (half each way); yields target port -> the port to use instead. Always stopped
    afterwards."""
    command = [sys.executable, "-m", "bench.delay", "--delay-ms", str(latency_ms / 2),
               *(str(target) for target in targets)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline().strip()
        word, _, ports = line.partition(" ")
        if word != "ready":
            raise RuntimeError(f"the delay proxy did not start (exit {process.poll()}): "
                               f"{line!r}")
        routes = {int(target): listen for target, listen in json.loads(ports).items()}
        yield Proxy(routes, process)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def round_trip_ms(port: int, tries: int = 20) -> float:
    """The median time of a tiny HTTP request to ``port`` on one kept-alive connection, in
    ms (what a reader of a results file checks the proxy against)."""
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    times = []
    try:
        for _ in range(tries):
            begin = time.perf_counter()
            connection.request("GET", "/devstoreaccount1?comp=list")
            connection.getresponse().read()
            times.append((time.perf_counter() - begin) * 1000)
    finally:
        connection.close()
    times.sort()
    return times[len(times) // 2]


if __name__ == "__main__":
    main()
