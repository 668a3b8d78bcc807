"""Heartbeats: each process serving endpoints says so every interval; ``bus status`` and the
operator API show who serves what, and flag an endpoint whose messages wait with no live
instance - on the in-memory store and, with a polling worker killed, on Azurite."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from bus import Bus, Command, Endpoint, Settings
from bus.adapters.memory import InMemoryStorage
from bus.hosting.maintenance import maintenance_pass
from bus.hosting.worker import Worker
from bus.observability import heartbeat
from bus.observability.heartbeat import Heartbeat
from bus.operations.cli import main
from bus.seams import Seams
from bus.testing.seamed import seamed_bus

ROOT = Path(__file__).resolve().parents[2]


class Ping(Command):
    n: int = 0


def _bus(storage: InMemoryStorage | None = None, clock: list[float] | None = None,
         every: float | None = 10.0) -> Bus:
    billing = Endpoint("billing")
    billing.handles(Ping, partition=lambda m: "p")(lambda ctx, msg: None)
    settings = Settings(heartbeat_seconds=every)
    if clock is not None:
        return seamed_bus(Seams(clock=lambda: clock[0]), storage or InMemoryStorage(),
                          [billing], settings=settings)
    return Bus(storage or InMemoryStorage(), [billing], settings=settings)


def test_an_instance_is_live_for_one_and_a_half_intervals_after_its_last_beat() -> None:
    now = [1_000.0]
    bus = _bus(clock=now)
    bus.provision()
    beat = Heartbeat(bus.storage.tables, bus.names.instances_table, "worker", 10.0,
                     lambda: now[0], instance="i1")
    beat._endpoints["billing"] = 1  # serving, without the thread: the test writes the beats
    assert beat.beat()
    [instance] = bus.instances()
    assert (instance.id, instance.kind, instance.endpoints, instance.every) == (
        "i1", "worker", ("billing",), 10.0)
    assert instance.pid == os.getpid() and instance.version and instance.host
    bus.send(Ping(), to="billing")
    assert [h.live for h in bus.health(now=1_015.0)] == [("i1",)]
    [health] = bus.health(now=1_015.1)
    assert (health.live, health.depth, health.unserved) == ((), 1, True)
    assert beat.beat(stopped=True)
    assert not bus.instances()[0].live(now[0])  # stopped: not live at once


def test_no_messages_waiting_is_not_unserved() -> None:
    bus = _bus()
    bus.provision()
    [health] = bus.health()
    assert (health.live, health.depth, health.unserved) == ((), 0, False)


def test_a_worker_s_loop_beats_while_it_runs_and_says_it_stopped() -> None:
    bus = _bus(every=0.05)
    bus.provision()
    stop = threading.Event()
    worker = Worker(bus, "billing")
    thread = threading.Thread(target=worker.run, args=(stop,))
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not bus.instances() and time.monotonic() < deadline:
            time.sleep(0.01)
        [instance] = bus.instances()
        assert instance.kind == "worker" and instance.endpoints == ("billing",)
        assert [h.live for h in bus.health()] == [(instance.id,)]
    finally:
        stop.set()
        thread.join()
    [instance] = bus.instances()
    assert instance.stopped and not instance.live(time.time())
    assert instance.endpoints == ("billing",)  # what it served last


def test_a_beat_that_fails_is_logged_and_the_process_goes_on(
        caplog: pytest.LogCaptureFixture) -> None:
    bus = _bus()  # not provisioned: the instances table does not exist
    beat = Heartbeat(bus.storage.tables, bus.names.instances_table, "worker", 10.0, time.time)
    assert beat.beat() is False
    assert "could not write the heartbeat" in caplog.text


def test_maintenance_forgets_instances_not_seen_for_a_day() -> None:
    now = [1_000_000.0]
    bus = _bus(clock=now)
    bus.provision()
    for name, seen in (("old", now[0] - heartbeat.FORGET_SECONDS - 1), ("recent", now[0] - 60)):
        Heartbeat(bus.storage.tables, bus.names.instances_table, "worker", 10.0,
                  lambda seen=seen: seen, instance=name).beat()
    assert maintenance_pass(bus).instances_forgotten == 1
    assert [i.id for i in bus.instances()] == ["recent"]


def test_rows_that_are_not_instances_are_left_out() -> None:
    from bus.storage import Entity

    bus = _bus()
    bus.provision()
    bus.storage.tables.replace(bus.names.instances_table,
                               Entity(heartbeat.PARTITION, "junk", {"every": "often"}))
    assert bus.instances() == []


def test_status_prints_each_endpoint_and_instance(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    app = _app(tmp_path, "memory:status-test")
    (app / "status_app.py").write_text((app / "function_app.py").read_text())
    monkeypatch.chdir(app)
    monkeypatch.syspath_prepend(str(app))
    for name in ("AzureWebJobsStorage", "BUS_PREFIX", "BUS_HEARTBEAT_SECONDS"):
        monkeypatch.delenv(name, raising=False)  # the app's settings are local.settings.json's
    provisioned = CliRunner().invoke(main, ["provision", "--app", "status_app"])
    assert provisioned.exit_code == 0, provisioned.output
    from bus.operations.apps import load_bus

    bus = load_bus("status_app")
    bus.send(Ping(), to="billing")
    result = CliRunner().invoke(main, ["status", "--check", "--app", "status_app"])
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    assert lines[0].split() == ["endpoint", "live", "queue", "poison"]
    assert lines[1].split()[:4] == ["billing", "0", "1", "0"] and "UNSERVED" in lines[1]
    assert "no instance has written a heartbeat" in result.output
    beat = Heartbeat(bus.storage.tables, bus.names.instances_table, "worker", 10.0,
                     time.time, instance="w1")
    beat._endpoints["billing"] = 1
    beat.beat()
    result = CliRunner().invoke(main, ["status", "--check", "--json", "--app", "status_app"])
    assert result.exit_code == 0, result.output
    endpoint, instance = (json.loads(line) for line in result.output.splitlines())
    assert endpoint == {"kind": "endpoint", "endpoint": "billing", "reader": False,
                        "live": ["w1"], "depth": 1, "poisoned": 0, "unserved": False}
    assert (instance["id"], instance["host_kind"], instance["live"]) == ("w1", "worker", True)


def _app(folder: Path, connection: str, prefix: str = "") -> Path:
    """An app folder: one endpoint, billing, whose handler records each Ping."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "function_app.py").write_text(textwrap.dedent("""\
        from bus import Command, Endpoint, connect


        class Ping(Command):
            message_type = "Ping"
            n: int = 0


        billing = Endpoint("billing")


        @billing.handles(Ping, partition=lambda m: str(m.n))
        def ping(ctx, msg):
            ctx.state.put("seen", {"n": msg.n})


        bus = connect(endpoints=[billing])
        """))
    (folder / "local.settings.json").write_text(json.dumps({"Values": {
        "AzureWebJobsStorage": connection, "BUS_PREFIX": prefix}}))
    return folder


@pytest.mark.azurite
def test_a_killed_worker_s_endpoint_shows_no_live_instance_within_two_intervals(
        tmp_path: Path, azurite_connection: str, prefix: str) -> None:
    """``python -m bus worker`` beats every second; killed (SIGKILL: nothing written on the
    way out), its endpoint is unserved two intervals later, by ``bus status`` and the API."""
    every = 1.0
    app = _app(tmp_path / "app", azurite_connection, prefix)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BUS_HEARTBEAT_SECONDS": str(every)}
    subprocess.run([sys.executable, "-m", "bus", "provision"], cwd=app, env=env, check=True,
                   capture_output=True, timeout=120)
    worker = subprocess.Popen([sys.executable, "-m", "bus", "worker"], cwd=app, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        live = _wait_for(lambda: _status(app, env)[0]["live"], timeout=60)
        assert len(live) == 1
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=30)
    killed_at = time.time()
    from bus import connect

    bus = connect(azurite_connection, [Endpoint("billing")], prefix=prefix)
    bus.send(Ping(), to="billing")  # a message waits: nobody takes it
    [instance] = bus.instances()
    assert instance.id == live[0] and not instance.stopped and instance.last_seen <= killed_at
    assert [h.unserved for h in bus.health(now=killed_at + 2 * every)] == [True]
    time.sleep(max(0.0, killed_at + 2 * every - time.time()))
    endpoint, listed = _status(app, env, "--check", code=1)
    assert (endpoint["live"], endpoint["depth"], endpoint["unserved"]) == ([], 1, True)
    assert (listed["id"], listed["live"], listed["stopped"]) == (live[0], False, False)


def _status(app: Path, env: dict[str, str], *options: str,
            code: int = 0) -> list[dict[str, object]]:
    done = subprocess.run([sys.executable, "-m", "bus", "status", "--json", *options],
                          cwd=app, env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == code, (done.stdout, done.stderr)
    return [json.loads(line) for line in done.stdout.splitlines()]


def _wait_for(probe, timeout: float):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout} s")
