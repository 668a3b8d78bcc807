"""The sample app through the local host on Azurite: end to end, SIGKILL, poison rules."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from azure.storage.queue import QueueServiceClient

from devhost.loader import Function
from devhost.queues import QueueListener, QueueOptions

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.azurite


def test_demo_end_to_end_prints_exactly_once_json() -> None:
    """`python -m devhost.demo` (what `make demo` runs), smaller: both dispatch paths."""
    run = subprocess.run([sys.executable, "-m", "devhost.demo", "--orders", "40",
                          "--customers", "10", "--duplicate-rate", "0.25"],
                         cwd=ROOT, capture_output=True, text=True, timeout=240, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["sent"] == 40 and result["processed"] == 160
    assert result["effects_applied_twice"] == 0 and result["lost"] == 0
    assert result["duplicates_injected"] > 0
    assert result["duplicates_dropped"] >= result["duplicates_injected"]
    assert result["poisoned"] == 5
    assert result["orchestrations"] == 40  # OrderPlaced has two copies: over inline-max 1


@pytest.fixture
def app_env(azurite_connection: str, prefix: str) -> Iterator[dict[str, str]]:
    env = dict(os.environ, AzureWebJobsStorage=azurite_connection, BUS_PREFIX=prefix,
               BUS_INLINE_DISPATCH_MAX="1", AzureWebJobsScriptRoot=str(ROOT))
    saved = dict(os.environ)
    os.environ.update(env)
    sys.modules.pop("function_app", None)
    yield env
    os.environ.clear()
    os.environ.update(saved)
    sys.modules.pop("function_app", None)


def _devhost(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "devhost", "--log-level", "WARNING",
                             "--lease-seconds", "6", "--timer-seconds", "5"],
                            cwd=ROOT, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT)


def _counters(bus: Any, endpoint: str, row: str, field: str) -> dict[str, int]:
    table = bus.names.state_table(endpoint)
    return {e.partition_key: int(e.properties.get(field, 0))
            for e in bus.storage.tables.query(table, row_key=row)}


def test_sigkill_mid_run_then_restart_keeps_effects_exactly_once(
        app_env: dict[str, str], tmp_path: Path) -> None:
    import function_app as app

    bus = app.bus_functions.bus
    bus.provision()
    orders = [f"k{i:03d}" for i in range(60)]
    for order_id in orders:
        bus.send(app.PlaceOrder(order_id=order_id, customer=f"c{order_id[-1]}",
                                amount_cents=100))
    host = _devhost(app_env, tmp_path / "devhost.log")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and _done(bus, "orders", "order", "placed") < 15:
        time.sleep(0.2)
    host.send_signal(signal.SIGKILL)  # mid-run: leases, orchestrations and outboxes in flight
    host.wait()
    assert _done(bus, "orders", "order", "billed") < len(orders), "killed too late"
    host = _devhost(app_env, tmp_path / "devhost.log")
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert host.poll() is None, _tail(tmp_path / "devhost.log")
            billed = _done(bus, "orders", "order", "billed")
            packed = _done(bus, "shipping", "shipment", "packed")
            if billed == packed == len(orders):
                break
            time.sleep(1)
    finally:
        host.send_signal(signal.SIGTERM)
        host.wait(timeout=60)
    for endpoint, row, field in (("orders", "order", "placed"), ("orders", "order", "billed"),
                                 ("shipping", "shipment", "packed")):
        counts = _counters(bus, endpoint, row, field)
        assert sorted(counts) == orders, (endpoint, field)
        assert set(counts.values()) == {1}, (endpoint, field, counts)


def _tail(log: Path) -> str:
    return "the devhost exited:\n" + log.read_text()[-3000:]


def _done(bus: Any, endpoint: str, row: str, field: str) -> int:
    return sum(1 for count in _counters(bus, endpoint, row, field).values() if count)


# -- the host's poison rules, on the devhost's listener ----------------------------------------
class _Recorder:
    def __init__(self, fail: bool) -> None:
        self.calls: list[tuple[bytes, int]] = []
        self.fail = fail

    def __call__(self, msg: Any) -> None:
        self.calls.append((msg.get_body(), msg.dequeue_count))
        if self.fail:
            raise RuntimeError("always fails")


def _listen(connection: str, queue: str, recorder: _Recorder, seconds: float) -> None:
    function = Function(name="probe", trigger_type="queueTrigger",
                        trigger={"type": "queueTrigger", "name": "msg", "queueName": queue},
                        bindings=[], user_function=recorder, is_async=False)
    options = QueueOptions(batch_size=4, max_polling_interval=0.2, visibility_timeout=0.0,
                           max_dequeue_count=3)
    listener = QueueListener(function, QueueServiceClient.from_connection_string(connection),
                             options, {})

    async def run() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(seconds, stop.set)
        await listener.run(stop)

    asyncio.run(run())


def test_host_poison_rules(azurite_connection: str, prefix: str) -> None:
    service = QueueServiceClient.from_connection_string(azurite_connection)
    queue, poison = service.get_queue_client(prefix), service.get_queue_client(prefix + "-poison")
    queue.create_queue()
    good = base64.b64encode(b"hello").decode()
    queue.send_message("%%% not base64 %%%")
    queue.send_message(good)
    recorder = _Recorder(fail=True)
    _listen(azurite_connection, prefix, recorder, seconds=6)
    # Undecodable: poisoned without invoking. Failing: invoked maxDequeueCount times, then
    # copied to the poison queue as it was.
    assert recorder.calls == [(b"hello", 1), (b"hello", 2), (b"hello", 3)]
    poisoned = sorted(m.content for m in poison.receive_messages(max_messages=32))
    assert poisoned == sorted(["%%% not base64 %%%", good])
    assert queue.get_queue_properties().approximate_message_count == 0


def test_over_dequeued_message_is_poisoned_without_invoking(azurite_connection: str,
                                                            prefix: str) -> None:
    service = QueueServiceClient.from_connection_string(azurite_connection)
    queue = service.get_queue_client(prefix)
    queue.create_queue()
    queue.send_message(base64.b64encode(b"tired").decode())
    for _ in range(3):  # dequeued 3 times already: the 4th delivery exceeds the maximum
        message = next(iter(queue.receive_messages(max_messages=1)))
        queue.update_message(message, visibility_timeout=0)
    recorder = _Recorder(fail=False)
    _listen(azurite_connection, prefix, recorder, seconds=2)
    assert recorder.calls == []
    assert service.get_queue_client(prefix + "-poison").get_queue_properties(
    ).approximate_message_count == 1
