"""The sweeper drops a deferral's index row only while it still points to a token that is
gone: a deferral of the same message id made between the scan and the drop keeps its row (a
scan is no snapshot on Azure) - on the in-memory backend and Azurite."""

from __future__ import annotations

from bus import Bus
from bus.protocol.tokens.inbox import Inbox
from bus.storage import Storage


def test_a_deferral_made_after_the_scan_keeps_its_index(storage: Storage, prefix: str) -> None:
    bus = Bus(storage, [], prefix=prefix)
    bus.provision()
    inbox: Inbox = bus.parts.inbox
    inbox.create("orders", "a1", "m1", 0.0)
    first = inbox.read("orders", "a1")
    assert first is not None and inbox.defer(first, "c2lnbmFs", 1.0)
    inbox.consume("orders", "a1")  # released and processed: the index row is stale
    [stale] = inbox.stale_index()
    assert (stale.endpoint, stale.message_id) == ("orders", "m1")
    # Meanwhile the same message id comes again (a new copy) and is deferred.
    inbox.create("orders", "a2", "m1", 2.0)
    second = inbox.read("orders", "a2")
    assert second is not None and inbox.defer(second, "c2lnbmFs", 3.0)
    inbox.drop_index(stale)
    found = inbox.find("orders", "m1")
    assert found is not None and found.attempt_id == "a2"  # still found by id
    assert inbox.stale_index() == []
