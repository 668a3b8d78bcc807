import uuid

import pytest

from bus.adapters.azure import AzureStorage
from bus.testing.contract import StorageContract

pytestmark = pytest.mark.azurite


class TestAzuriteStorage(StorageContract):
    @pytest.fixture
    def storage(self, azure_storage: AzureStorage) -> AzureStorage:
        return azure_storage

    @pytest.fixture
    def name(self) -> str:
        return "c" + uuid.uuid4().hex[:12]

    @pytest.fixture
    def table(self) -> str:
        return "t" + uuid.uuid4().hex[:12]
