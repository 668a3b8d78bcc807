"""The Functions host merges a JSON body's top-level properties into the queue trigger's
metadata, over its own (its dequeue count among them): a body carrying such a name could set
what the trigger reads from outside the signature. No envelope or bundle the bus writes
carries one, so such a body is poisoned unread - its token left alone - and the real copy
is processed."""

from __future__ import annotations

import base64
import json

import pytest

from bus.envelope import HOST_METADATA, encode_bundle
from bus.storage import Storage
from bus.testing import drain
from tests.protocol.test_signing import K1, Ping, app, put, reasons, signing, take


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
    bundle = json.loads(base64.b64decode(encode_bundle([json.dumps(copy)])))
    put(bus, {**bundle, "DequeueCount": 5})
    put(bus, copy)
    assert drain(bus, fail_fast=False)["desk"] == {"poisoned": 1, "processed": 1}
    assert seen == ["desk:a", "log:a"]
