"""Scenario 10, the exactly-once hop on the Functions path: the app users deploy.

``bench-a``'s Ping handler (scenario 2's) runs as an Azure Functions app
(``bench/functions_app``) under the local host, which drives the real Python worker
(``devhost``: the host's queue trigger, one message per invocation, as on Azure). Everything
the host and its worker send to storage goes through the delay proxy, which counts it
(``bench.delay.Proxy.requests``): that is the Functions path's requests per hop, the host's
polling included, as Azure bills them; the client's sends from this process are counted apart
(``bench.wire``) and left out, as in scenario 2.

Two runs, each on a fresh Azurite and host: **single** - the client sends one Ping per queue
message (send groups off), so each invocation handles one signal, the case of a chain started
by lone sends - and **grouped** - the client's send group bundles the Pings that overlap, so an
invocation handles a bundle. After a warm-up (the host starts, indexes the app and handles 16
Pings), the producers send ``cfg.messages`` Pings; the clock runs from the first send until
every partition's counter holds its Pings (polled every 0.2 s), which is also the check.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from bench.config import BenchConfig
from bench.delay import Proxy, delayed
from bench.harness import BenchError, ScenarioResult, progress
from bench.wire import classify, counting_requests
from bench.workload import (
    COUNT_ROW,
    HOP_FROM,
    Ping,
    expected_counts,
    hop_endpoints,
    partition_key,
)
from bus import Bus, Settings
from bus.adapters.azure import AzureStorage
from devhost.azurite import Azurite, connection_string
from devhost.process import start_host, stop_host

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "bench" / "functions_app"
WARMUP = 16
SERVICES = ("blob", "queue", "table")


@dataclass
class FunctionsRun:
    variant: str
    messages: int
    seconds: float
    ops: dict[tuple[str, str], int]
    """The host's and worker's requests, by (service, request), over the timed interval."""
    send_seconds: float = 0.0
    """When the client's last send returned (from the first): near ``seconds``, the client
    was the bottleneck, not the Functions path."""

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0

    @property
    def requests_per_hop(self) -> float:
        return sum(self.ops.values()) / self.messages


def run(cfg: BenchConfig) -> ScenarioResult:
    runs = [one_run(cfg, variant) for variant in ("single", "grouped")]
    for done in runs:
        progress(f"      {done.variant}: {done.rate:.1f} msgs/s ({done.messages} in "
                 f"{done.seconds:.1f} s, the client's sends done at {done.send_seconds:.1f} s), "
                 f"{done.requests_per_hop:.2f} requests per hop")
    single = runs[0]
    return ScenarioResult(
        key="functions_hop", title="exactly-once hop through the Functions host and worker",
        units=single.messages, seconds=single.seconds,
        verified=("every partition's counter equals its Pings (exactly once), single and "
                  "grouped sends; the host's and worker's requests counted at the proxy"),
        extra={"ops": single.ops, "functions_runs": runs})


def one_run(cfg: BenchConfig, variant: str) -> FunctionsRun:
    emulator = Azurite()
    workdir = Path(tempfile.mkdtemp(prefix=f"bench-functions-{variant}-"))
    try:
        emulator.start()
        # The proxy runs even without latency (a microsecond): it is what counts the requests
        # of the host and its worker, which run in processes of their own.
        with delayed(emulator.ports, max(cfg.latency_ms, 0.001)) as proxy:
            connection = connection_string(*(proxy[port] for port in emulator.ports))
            services = dict(zip(emulator.ports, SERVICES, strict=True))
            return _measure(cfg, variant, connection, proxy=proxy, services=services,
                            workdir=workdir)
    finally:
        emulator.stop()


def _measure(cfg: BenchConfig, variant: str, connection: str, *, proxy: Proxy,
             services: dict[int, str], workdir: Path) -> FunctionsRun:
    client = Bus(AzureStorage.from_connection_string(connection), hop_endpoints(),
                 settings=Settings(group_sends=variant == "grouped"))
    client.provision()
    table = client.names.state_table(HOP_FROM)
    host = _start_host(connection, workdir)
    try:
        with counting_requests(connection) as wire:
            _send(client, range(WARMUP), 1, cfg.partitions)
            _wait(client, table, expected_counts(range(WARMUP), cfg.partitions), host=host,
                  workdir=workdir, timeout=120.0)
            wire.reset()
            before = proxy.requests()
            seqs = range(WARMUP, WARMUP + cfg.messages)
            begin = time.perf_counter()
            sent: list[float] = []

            def send() -> None:
                _send(client, seqs, cfg.producers, cfg.partitions)
                sent.append(time.perf_counter() - begin)

            sender = threading.Thread(target=send)
            sender.start()
            _wait(client, table, expected_counts(range(WARMUP + cfg.messages),
                                                 cfg.partitions), host=host, workdir=workdir,
                  timeout=cfg.timeout)
            seconds = time.perf_counter() - begin
            sender.join()
            after = proxy.requests()
            mine = wire.totals()
    finally:
        stop_host(host)
    ops = _by_operation(before, after, services)
    for key, n in mine.items():  # this process's requests (the client, the polls) are not
        ops[key] = ops.get(key, 0) - n  # the Functions path's
    return FunctionsRun(variant, cfg.messages, seconds, {k: n for k, n in ops.items() if n > 0},
                        send_seconds=sent[0] if sent else seconds)


def _by_operation(before: dict[tuple[int, str, str], int],
                  after: dict[tuple[int, str, str], int],
                  services: dict[int, str]) -> dict[tuple[str, str], int]:
    ops: Counter[tuple[str, str]] = Counter()
    for (port, method, path), n in after.items():
        service = services[port]
        ops[(service, classify(service, method, path))] += n - before.get((port, method, path), 0)
    return dict(ops)


def _send(client: Bus, seqs: range, producers: int, partitions: int) -> None:
    def produce(share: range) -> None:
        for seq in share:
            client.send(Ping(seq=seq, key=partition_key(seq, partitions), sent_at=time.time()))

    threads = [threading.Thread(target=produce, args=(seqs[i::producers],))
               for i in range(producers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _wait(client: Bus, table: str, expected: Counter[str], *, host: subprocess.Popen[bytes],
          workdir: Path, timeout: float) -> None:
    """Until every partition's counter holds its Pings; BenchError on a surplus (an effect
    twice), a host that exited, or the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        counts = {row.partition_key: _count(row.properties.get("n"))
                  for row in client.storage.tables.query(table)
                  if row.row_key == COUNT_ROW}
        over = {p: n for p, n in counts.items() if n > expected.get(p, 0)}
        if over:
            raise BenchError(f"functions hop: effects applied twice in {len(over)} partitions")
        if all(counts.get(p, 0) == n for p, n in expected.items()):
            return
        if host.poll() is not None:
            log = (workdir / "devhost.log").read_text(errors="replace")
            raise BenchError(f"the local host exited with {host.returncode}: {log[-2000:]}")
        if time.monotonic() > deadline:
            done = sum(min(counts.get(p, 0), n) for p, n in expected.items())
            raise BenchError(f"functions hop: {done} of {sum(expected.values())} Pings "
                             f"handled within {timeout:.0f} s")
        time.sleep(0.2)


def _count(value: object) -> int:
    return value if isinstance(value, int) else 0


def _start_host(connection: str, workdir: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, AzureWebJobsStorage=connection, BUS_PREFIX="",
               BUS_ENDPOINTS=HOP_FROM, BUS_DURABLE_HUB="BenchHub",
               AzureWebJobsScriptRoot=str(APP),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT),
                                                        os.environ.get("PYTHONPATH")])))
    return start_host(workdir, env, script_root=APP)
