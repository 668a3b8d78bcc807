import pytest

from bus.adapters.memory import Fault, NoFaults
from bus.storage import Entity, TransientError
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
