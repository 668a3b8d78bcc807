"""A loopback TCP proxy that holds every chunk for a fixed time each way: Azure's latency put
between a benchmark and Azurite.

A request to Azure Storage from a function in the same region takes about 5-10 ms end to end;
to Azurite on loopback about 1 ms. Requests one after another that look free locally are what
limits throughput in Azure, and a benchmark without the latency cannot show it (nor whether
running a round's requests concurrently helps). With ``--delay-ms d`` each chunk of bytes is
forwarded ``d`` ms after it arrived, in order, in both directions: a request on a kept-alive
connection waits ``2 d`` ms more for its response than it would without the proxy.

    python -m bench.delay --delay-ms 2.5 LISTEN_PORT:TARGET_PORT [...]

prints ``ready`` once every listening port accepts, and runs until terminated. It is its own
process, so its work does not share the measured Python process's interpreter lock (it shares
the machine's cores, as Azurite does). Connections are held on both sides as the client opens
them: the SDKs' connection pools (10 per service client) behave as they would against Azure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence

CHUNK = 1 << 16


async def _forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                   delay: float) -> None:
    """Copy ``reader`` to ``writer``, each chunk ``delay`` seconds after it was read, in order.

    Reading goes on while earlier chunks wait, so the delay is added once per chunk, not
    once per chunk behind it (a pipe's latency, not its bandwidth)."""
    loop = asyncio.get_running_loop()
    held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def read() -> None:
        try:
            while data := await reader.read(CHUNK):
                held.put_nowait((loop.time() + delay, data))
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
                      client_writer: asyncio.StreamWriter, target: int, delay: float) -> None:
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
        await asyncio.gather(_forward(client_reader, server_writer, delay),
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


async def serve(routes: Sequence[tuple[int, int]], delay: float) -> None:
    """Listen on each route's first port, forwarding to its second, until cancelled. Each chunk
    is held ``delay`` seconds, less the event loop's measured oversleep."""
    if delay > 0:
        delay = max(0.0, delay - await _overshoot(delay))
    servers = []
    live: set[asyncio.Task[None]] = set()  # the loop keeps only weak references to tasks
    for listen, target in routes:
        def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                   target: int = target) -> None:
            task = asyncio.create_task(_connection(reader, writer, target, delay))
            live.add(task)
            task.add_done_callback(live.discard)
        servers.append(await asyncio.start_server(handle, "127.0.0.1", listen))
    print("ready", flush=True)
    await asyncio.gather(*(server.serve_forever() for server in servers))


def _route(text: str) -> tuple[int, int]:
    listen, _, target = text.partition(":")
    return int(listen), int(target)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.delay", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--delay-ms", type=float, required=True,
                        help="milliseconds each chunk is held, each way")
    parser.add_argument("routes", nargs="+", type=_route, metavar="LISTEN:TARGET")
    args = parser.parse_args(argv)
    # Terminated between two runs: nothing to flush or close, the connections go with it.
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.routes, args.delay_ms / 1000))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def delayed(targets: Sequence[int], latency_ms: float) -> Iterator[dict[int, int]]:
    """A proxy process in front of each of ``targets`` adding ``latency_ms`` to every request's
    round trip (half each way); yields target port -> the port to use instead. Always stopped
    afterwards."""
    routes = {target: _free_port() for target in targets}
    command = [sys.executable, "-m", "bench.delay", "--delay-ms", str(latency_ms / 2),
               *(f"{listen}:{target}" for target, listen in routes.items())]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline().strip()
        if line != "ready":
            raise RuntimeError(f"the delay proxy did not start (exit {process.poll()}): "
                               f"{line!r}")
        yield routes
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
