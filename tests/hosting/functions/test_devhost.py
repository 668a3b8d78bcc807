"""The sample app through the local host on Azurite: end to end, SIGKILL, poison rules."""

from __future__ import annotations

import asyncio
import base64
import contextlib
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
from azure.core.exceptions import ServiceRequestError
from azure.core.pipeline import PipelineRequest
from azure.storage.queue import QueueClient, QueueServiceClient

from bus.hosting.local.queues import Counters, QueueListener, QueueOptions
from bus.hosting.local.worker import Worker
from devhost.azurite import Azurite

ROOT = Path(__file__).resolve().parents[3]
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
    assert result["finished"] is True and result["unfinished"] == 0
    assert result["duplicates_injected"] > 0
    assert result["copies_processed"] == 160  # as the receivers counted them
    assert result["duplicates_dropped"] >= result["duplicates_injected"]
    assert result["poisoned"] == 5
    assert result["orchestrations"] == 40  # OrderPlaced has two copies: over inline-max 1


def test_demo_out_of_time_reports_its_work_unfinished_not_lost() -> None:
    """A demo whose timeout is shorter than its work says what had not happened yet is
    unfinished (and exits non-zero): a loaded machine is slow, which is no loss."""
    run = subprocess.run([sys.executable, "-m", "devhost.demo", "--orders", "40",
                          "--customers", "10", "--timeout", "0"],
                         cwd=ROOT, capture_output=True, text=True, timeout=240, check=False)
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["finished"] is False and result["lost"] == 0
    assert result["unfinished"] == 160 - result["processed"]
    assert "UNFINISHED at the 0 s timeout" in run.stdout and "; lost:" not in run.stdout


@contextlib.contextmanager
def _app_environ(settings: dict[str, str]) -> Iterator[None]:
    """``settings`` in this process's environment and a fresh import of function_app;
    everything as it was afterwards."""
    saved = dict(os.environ)
    os.environ.update(settings)
    sys.modules.pop("function_app", None)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
        sys.modules.pop("function_app", None)


@contextlib.contextmanager
def app_settings(connection: str, prefix: str) -> Iterator[dict[str, str]]:
    """The sample app's settings in this process (and for a devhost started with them), a
    fresh import of function_app; everything as it was afterwards."""
    env = dict(os.environ, AzureWebJobsStorage=connection, BUS_PREFIX=prefix,
               BUS_INLINE_DISPATCH_MAX="1", BUS_DURABLE_HUB=f"Hub{prefix}",
               AzureWebJobsScriptRoot=str(ROOT))
    with _app_environ(env):
        yield env


@pytest.fixture
def app_env(azurite_connection: str, prefix: str) -> Iterator[dict[str, str]]:
    with app_settings(azurite_connection, prefix) as env:
        yield env


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


# -- the host's queue rules, on the devhost's listener and the real worker ------------------
PROBE_APP = Path(__file__).resolve().parent / "probe_app"


def _listen(connection: str, queue: str, seconds: float, *, mode: str = "ok",
            **options: Any) -> tuple[list[tuple[str, int]], Counters]:
    """Run the probe app's queue trigger through the worker for ``seconds``; its calls and
    the listener's counters."""
    settings = {"PROBE_QUEUE": queue, "PROBE_MODE": mode, "AzureWebJobsStorage": connection}
    with _app_environ(settings):
        return asyncio.run(_run_probe(connection, seconds, QueueOptions(
            **{"batch_size": 4, "max_polling_interval": 0.2, "visibility_timeout": 0.0,
               "max_dequeue_count": 3, **options})))


async def _run_probe(connection: str, seconds: float,
                     options: QueueOptions) -> tuple[list[tuple[str, int]], Counters]:
    worker = Worker(PROBE_APP)
    index = await worker.start()
    try:
        listener = QueueListener(index.named("probe"), worker,
                                 QueueServiceClient.from_connection_string(connection), options,
                                 {})
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(seconds, stop.set)
        await listener.run(stop)
    finally:
        worker.stop()
    calls: list[tuple[str, int]] = sys.modules["function_app"].CALLS
    return calls, listener.counters


def test_a_poll_is_one_request_for_up_to_a_batch(azurite_connection: str, prefix: str) -> None:
    """The host's listener asks ``batchSize`` messages in one request; the SDK's pager, left
    to itself, asks one per request (and asks again after a short page)."""
    queue, gets = prefix + "poll", []
    service = QueueServiceClient.from_connection_string(azurite_connection)
    service.create_queue(queue)
    for n in range(3):
        service.get_queue_client(queue).send_message(f"m{n}")

    def counted(request: PipelineRequest[Any]) -> None:
        if request.http_request.method == "GET":
            gets.append("GET")

    async def poll() -> int:
        worker = Worker(PROBE_APP)
        index = await worker.start()
        try:
            listener = QueueListener(index.named("probe"), worker, service,
                                     QueueOptions(batch_size=16), {})
            listener.queue = QueueClient.from_connection_string(  # the same, its GETs counted
                azurite_connection, queue, raw_request_hook=counted)
            return len(listener._receive_batch())
        finally:
            worker.stop()

    with _app_environ({"PROBE_QUEUE": queue, "AzureWebJobsStorage": azurite_connection}):
        assert asyncio.run(poll()) == 3
    assert gets == ["GET"]


def test_host_poison_rules(azurite_connection: str, prefix: str) -> None:
    service = QueueServiceClient.from_connection_string(azurite_connection)
    queue, poison = service.get_queue_client(prefix), service.get_queue_client(prefix + "-poison")
    queue.create_queue()
    good = base64.b64encode(b"hello").decode()
    not_utf8 = base64.b64encode(b"\xff\xfe").decode()
    queue.send_message("%%% not base64 %%%")
    queue.send_message(not_utf8)
    queue.send_message(good)
    calls, counters = _listen(azurite_connection, prefix, seconds=6, mode="fail")
    # Not base64: poisoned at once. Not UTF-8: the binding fails before the worker, three
    # times. Failing: invoked maxDequeueCount times (the body reaches the function as text).
    # Both failing ones then copied to the poison queue as they were.
    assert calls == [("hello", 1), ("hello", 2), ("hello", 3)]
    poisoned = sorted(m.content for m in poison.receive_messages(max_messages=32))
    assert poisoned == sorted(["%%% not base64 %%%", not_utf8, good])
    assert queue.get_queue_properties().approximate_message_count == 0
    assert counters.failed == 6 and counters.invoked == 3 and counters.poisoned == 3


def test_over_dequeued_message_is_poisoned_without_invoking(azurite_connection: str,
                                                            prefix: str) -> None:
    service = QueueServiceClient.from_connection_string(azurite_connection)
    queue = service.get_queue_client(prefix)
    queue.create_queue()
    queue.send_message(base64.b64encode(b"tired").decode())
    for _ in range(3):  # dequeued 3 times already: the 4th delivery exceeds the maximum
        message = next(iter(queue.receive_messages(max_messages=1)))
        queue.update_message(message, visibility_timeout=0)
    calls, _ = _listen(azurite_connection, prefix, seconds=2)
    assert calls == []
    assert service.get_queue_client(prefix + "-poison").get_queue_properties(
    ).approximate_message_count == 1


def test_function_timeout_fails_the_invocation_and_releases_the_message(
        azurite_connection: str, prefix: str) -> None:
    service = QueueServiceClient.from_connection_string(azurite_connection)
    queue = service.get_queue_client(prefix)
    queue.create_queue()
    queue.send_message(base64.b64encode(b"slow").decode())
    calls, counters = _listen(azurite_connection, prefix, seconds=3.5, mode="sleep:2",
                              function_timeout=0.5, max_dequeue_count=10)
    assert counters.timed_out >= 1 and counters.succeeded == 0, counters
    assert calls and all(body == "slow" for body, _ in calls)
    assert queue.get_queue_properties().approximate_message_count == 1  # not deleted


def test_lease_renewal_survives_failed_renewals(azurite_connection: str, prefix: str) -> None:
    """A renewal that fails is retried; the lease is kept and the message processed once."""
    service = QueueServiceClient.from_connection_string(azurite_connection)
    queue = service.get_queue_client(prefix)
    queue.create_queue()
    queue.send_message(base64.b64encode(b"long").decode())
    failures = [2]
    real_update = QueueClient.update_message

    def flaky_update(self: QueueClient, *args: Any, **kwargs: Any) -> Any:
        if failures[0] > 0 and kwargs.get("visibility_timeout", 0) > 0:
            failures[0] -= 1
            raise ServiceRequestError("connection reset (injected)")
        return real_update(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(QueueClient, "update_message", flaky_update)
        patch.setattr("bus.hosting.local.queues.RENEWAL_RETRY_SECONDS", 0.2)
        calls, counters = _listen(azurite_connection, prefix, seconds=6, mode="sleep:3.5",
                                  lease_seconds=2.0)
    assert counters.renewal_errors == 2 and counters.succeeded == 1, counters
    assert calls == [("long", 1)]  # the lease held: never delivered a second time
    assert queue.get_queue_properties().approximate_message_count == 0


# -- a storage outage under a running devhost ---------------------------------------------------
def test_devhost_survives_a_storage_outage(tmp_path: Path, prefix: str) -> None:
    """Azurite stopped and restarted (same ports, same data) under a running devhost: the
    listeners back off and keep polling, the host stays up, and every order completes once."""
    emulator = Azurite(location=tmp_path / "azurite")
    host = None
    try:
        with app_settings(emulator.start(), prefix) as env:
            import function_app as app

            bus = app.bus_functions.bus
            bus.provision()
            log = tmp_path / "devhost.log"
            host = _devhost(env, log)
            first = [f"a{i:02d}" for i in range(10)]
            _place(app, bus, first)
            _wait_until(host, log, lambda: _done(bus, "orders", "order", "billed") >= 5, 90)
            emulator.stop()  # storage away for longer than the SDK's own retries last
            time.sleep(25)
            assert host.poll() is None, _tail(log)
            emulator.start()
            second = [f"b{i:02d}" for i in range(10)]
            _place(app, bus, second)
            orders = first + second
            _wait_until(host, log, lambda: _done(bus, "orders", "order", "billed")
                        == _done(bus, "shipping", "shipment", "packed") == len(orders), 180)
            for endpoint, row, field in (("orders", "order", "placed"),
                                         ("orders", "order", "billed"),
                                         ("shipping", "shipment", "packed")):
                counts = _counters(bus, endpoint, row, field)
                assert sorted(counts) == orders and set(counts.values()) == {1}, counts
            assert "backing off" in log.read_text()  # the outage was seen, and survived
    finally:
        if host is not None:
            host.send_signal(signal.SIGTERM)
            host.wait(timeout=60)
        emulator.stop()


def _place(app: Any, bus: Any, order_ids: list[str]) -> None:
    for order_id in order_ids:
        bus.send(app.PlaceOrder(order_id=order_id, customer=f"c{order_id[-1]}",
                                amount_cents=100))


def _wait_until(host: subprocess.Popen[bytes], log: Path, done: Any, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert host.poll() is None, _tail(log)
        with contextlib.suppress(Exception):  # the test's own reads during the outage
            if done():
                return
        time.sleep(0.5)
    raise AssertionError(f"not done within {seconds} s; " + _tail(log))
