import pytest

from bus.adapters.memory import Fault, NoFaults
from bus.storage import Entity, NotFound, Refused, TransientError
from bus.testing import InMemoryStorage
from bus.testing.contract import StorageContract


class TestInMemoryStorage(StorageContract):
    @pytest.fixture
    def storage(self) -> InMemoryStorage:
        return InMemoryStorage()



class _OneRowPages(NoFaults):
    """Pages of one row; before the second page, another writer adds rows before and after
    the query's position."""

    def __init__(self) -> None:
        self.storage: InMemoryStorage | None = None
        self.pages = 0

    def page_length(self, limit: int) -> int:
        return 1

    def before_call(self, service: str, operation: str) -> Fault | None:
        if (service, operation) == ("table", "query"):
            self.pages += 1
            if self.pages == 2 and self.storage is not None:
                storage, self.storage = self.storage, None
                storage.tables.insert("t", Entity("p", "a", {}))
                storage.tables.insert("t", Entity("p", "e", {}))
        return None


def test_a_query_comes_in_pages_that_are_not_one_snapshot() -> None:
    """As on Azure: each page is a request of its own, and a row written between two pages
    is missed (before the query's position) or seen (after it)."""
    hooks = _OneRowPages()
    storage = InMemoryStorage(hooks)
    storage.tables.create_table("t")
    for key in ("b", "d"):
        storage.tables.insert("t", Entity("p", key, {}))
    hooks.storage = storage
    assert [e.row_key for e in storage.tables.query("t", "p")] == ["b", "d", "e"]
    assert hooks.pages == 3  # b, then d, then e: each page one request


def test_a_read_of_several_rows_split_into_pages_is_refused() -> None:
    """``get_many`` promises one snapshot: an answer in pages is a transient error."""
    hooks = _OneRowPages()
    storage = InMemoryStorage(hooks)
    storage.tables.create_table("t")
    for key in ("b", "d"):
        storage.tables.insert("t", Entity("p", key, {}))
    assert list(storage.tables.get_many("t", "p", ["b"])) == ["b"]
    with pytest.raises(TransientError, match="not one snapshot"):
        storage.tables.get_many("t", "p", ["b", "d"])


class _Clock(NoFaults):
    def __init__(self) -> None:
        self.at = 1_000.0

    def now(self) -> float:
        return self.at


def test_a_message_past_its_time_to_live_is_gone_without_trace() -> None:
    """As on Azure: an expired message is neither received nor counted; the bus's own sends
    (no time-to-live) never expire."""
    clock = _Clock()
    storage = InMemoryStorage(hooks=clock)
    storage.queues.create_queue("q")
    storage.queues.send("q", "short", time_to_live=10.0)
    storage.queues.send("q", "forever")
    storage.queues.send("q", "also forever", time_to_live=-1)
    clock.at += 9.0
    assert storage.queues.bodies("q") == ["short", "forever", "also forever"]
    clock.at += 2.0
    assert [m.body for m in storage.queues.receive("q", max_messages=32, lease=30.0)] == [
        "forever", "also forever"]
    assert storage.queues.depth("q") == 2 and storage.queues.expired == 1
    with pytest.raises(Refused):
        storage.queues.send("q", "x", time_to_live=0.0)


def test_an_expired_message_cannot_be_deleted_or_renewed() -> None:
    clock = _Clock()
    storage = InMemoryStorage(hooks=clock)
    storage.queues.create_queue("q")
    storage.queues.send("q", "short", time_to_live=10.0)
    [message] = storage.queues.receive("q", max_messages=1, lease=60.0)
    clock.at += 11.0
    with pytest.raises(NotFound):
        storage.queues.delete("q", message)
