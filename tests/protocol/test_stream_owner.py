"""A numbered copy's stream is its sender's: a client numbers in ``client:<its source>``, a
handler in ``<its endpoint>/<partition>``. With signing on, a key's sources authenticate the
source - so a producer whose key may sign only as itself cannot take a number in another's
stream (the app's own), which would have the real copy refused as behind its turn."""

from __future__ import annotations

import base64
import json

from bus import Bus, Command, Context, Endpoint
from bus.envelope import Envelope, encode_signal
from bus.protocol.copies.sealing import Sealer
from bus.settings import Settings
from bus.signing import Signing, SigningKey
from bus.storage import Storage
from bus.testing import drain

APP_KEY = SigningKey(key_id="k1", secret=bytes([1]) * 32)
SHOP_KEY = SigningKey(key_id="shop", secret=bytes([2]) * 32, sources=frozenset({"legacy-shop"}))


class Step(Command):
    order: str
    n: int


def taken(bus: Bus) -> Envelope:
    queue = bus.names.queue("s")
    [message] = bus.storage.queues.receive(queue, max_messages=1, lease=60)
    bus.storage.queues.delete(queue, message)
    return Envelope.model_validate(json.loads(base64.b64decode(message.body)))


def test_a_producer_cannot_number_in_the_apps_stream(storage: Storage, prefix: str) -> None:
    s = Endpoint("s")
    handled: list[int] = []

    @s.handles(Step, partition=lambda m: m.order, session=lambda m: m.order)
    def step(message: Step, ctx: Context) -> None:
        handled.append(message.n)

    keys = (APP_KEY, SHOP_KEY)
    app = Bus(storage, [s], prefix=prefix,
              settings=Settings(signing=Signing(mode="required", keys=keys, key_id="k1")))
    app.provision()
    app.send(Step(order="o1", n=1))
    real = taken(app)
    assert real.stream == "client:client" and real.sequence == 1
    # A foreign producer's copy, signed with its own key as itself - numbered in the app's
    # stream (as docs/envelope.md lets a producer without this package build one).
    producing = Signing(mode="required", keys=(SHOP_KEY,), key_id="shop")
    forged = Sealer(producing).resign(real.model_copy(update={
        "source": "legacy-shop", "message_id": "m-forged", "attempt_id": "a-forged",
        "payload": json.dumps({"order": "o1", "n": 99})}))
    app.parts.inbox.create("s", "a-forged", "m-forged", app.parts.clock())  # the producer role
    queue = app.names.queue("s")
    for envelope in (forged, real):
        app.storage.queues.send(queue, encode_signal(envelope))
    assert drain(app, fail_fast=False)["s"] == {"poisoned": 1, "processed": 1}
    assert handled == [1]
    [letter] = app.poisoned("s").entries()
    assert letter.entry.reason.startswith("stream 'client:client' is not its sender's")
