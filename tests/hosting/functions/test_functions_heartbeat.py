"""A Functions instance's heartbeat: none while the app is only imported (the command line
imports it too), then from its first invocation on, naming the endpoints it hosts."""

from __future__ import annotations

import time
from pathlib import Path

from bus import Context, Endpoint
from bus.hosting.functions.app import BusFunctions
from tests.hosting.functions.test_async_trigger import invoke_once
from tests.protocol.test_async_handlers import Pay


def test_an_instance_beats_from_its_first_invocation(tmp_path: Path) -> None:
    desk = Endpoint("desk")

    @desk.handles(Pay, partition=lambda m: m.ref)
    def pay(message: Pay, ctx: Context) -> None:
        ctx.state.put("paid", {"cents": message.cents})

    (tmp_path / "host.json").write_text("{}")
    functions = BusFunctions([desk], environ={"AzureWebJobsStorage": "memory:heartbeats",
                                              "BUS_HEARTBEAT_SECONDS": "0.05"},
                             host_json=tmp_path / "host.json")
    bus = functions.bus
    bus.provision()
    time.sleep(0.2)
    assert bus.instances() == []  # built, not invoked: no beat
    bus.send(Pay(ref="p1", cents=7))
    invoke_once(functions, "desk")
    deadline = time.monotonic() + 30
    while not bus.instances():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    [instance] = bus.instances()
    assert (instance.kind, instance.endpoints, instance.every) == ("functions", ("desk",), 0.05)
    assert [h.live for h in bus.health()] == [(instance.id,)]
    heartbeat = bus.parts.heartbeat("functions")
    assert heartbeat is not None
    heartbeat.stop()
    assert bus.instances()[0].stopped
