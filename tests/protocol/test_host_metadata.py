"""The Functions host merges a JSON body's top-level properties into the queue trigger's
metadata, over its own (its dequeue count among them): a body carrying such a name could set
what the trigger reads from outside the signature. No envelope or bundle the bus writes
carries one, so such a body is poisoned unread - its token left alone - and the real copy
is processed."""

from __future__ import annotations

import base64
import json

import pytest

from bus import Bus
from bus.envelope import HOST_METADATA, encode_bundle
from bus.storage import Storage
from bus.testing import drain
from tests.protocol.test_signing import K1, Ping, app, put, reasons, signing, take


def put_bundle(bus: Bus, copy: dict[str, object], **top: object) -> None:
    """A bundle of ``copy`` with ``top`` added to its top level, written as the bus writes
    one (compact JSON: a bundle is recognised by its first bytes)."""
    bundle = json.loads(base64.b64decode(encode_bundle([json.dumps(copy)])))
    raw = json.dumps({**bundle, **top}, separators=(",", ":"), ensure_ascii=False)
    bus.storage.queues.send(bus.names.queue("desk"), base64.b64encode(raw.encode()).decode())


@pytest.mark.parametrize("name", ["DequeueCount", "dequeuecount", "PopReceipt", "Id"])
def test_a_copy_carrying_a_host_metadata_name_is_poisoned_and_the_real_one_processed(
        name: str, storage: Storage, prefix: str) -> None:
    assert name.lower() in HOST_METADATA
    bus, seen = app(storage, prefix, signing(k1=K1))
    bus.send(Ping(key="a"))
    [copy] = take(bus)
    put(bus, {**copy, name: 5})  # outside the signature: it still verifies
    put(bus, copy)
    assert drain(bus, fail_fast=False)["desk"] == {"poisoned": 1, "processed": 1}
    assert seen == ["desk:a", "log:a"]
    [reason] = reasons(bus)
    assert reason.startswith(f"body carries {name!r}")


def test_a_bundle_carrying_another_top_level_name_is_poisoned_whole(
        storage: Storage, prefix: str) -> None:
    bus, seen = app(storage, prefix, signing(k1=K1))
    bus.send(Ping(key="a"))
    [copy] = take(bus)
    put_bundle(bus, copy, DequeueCount=5)
    put(bus, copy)
    assert drain(bus, fail_fast=False)["desk"] == {"poisoned": 1, "processed": 1}
    assert seen == ["desk:a", "log:a"]
    [reason] = reasons(bus)
    assert reason.startswith("body carries 'DequeueCount'")


def test_a_bundle_put_back_with_its_deliveries_is_still_taken_apart(
        storage: Storage, prefix: str) -> None:
    """The Functions trigger puts a bundle back while its endpoint is paused carrying
    ``deliveries``: a key of the bus's own, not the host's."""
    bus, seen = app(storage, prefix, signing(k1=K1))
    bus.send(Ping(key="a"))
    [copy] = take(bus)
    put_bundle(bus, copy, deliveries=2)
    assert drain(bus, fail_fast=False)["desk"] == {"processed": 1}
    assert seen == ["desk:a", "log:a"]
