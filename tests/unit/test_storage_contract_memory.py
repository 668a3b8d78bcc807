import uuid

import pytest

from bus.testing import InMemoryStorage
from bus.testing.contract import StorageContract


class TestInMemoryStorage(StorageContract):
    @pytest.fixture
    def storage(self) -> InMemoryStorage:
        return InMemoryStorage()

    @pytest.fixture
    def name(self) -> str:
        return "c" + uuid.uuid4().hex[:12]

    @pytest.fixture
    def table(self) -> str:
        return "t" + uuid.uuid4().hex[:12]
