import pytest

from bus.testing import InMemoryStorage
from bus.testing.contract import StorageContract


class TestInMemoryStorage(StorageContract):
    @pytest.fixture
    def storage(self) -> InMemoryStorage:
        return InMemoryStorage()

