import pytest

from bus.adapters.azure import AzureStorage
from bus.testing.contract import StorageContract

pytestmark = pytest.mark.azurite


class TestAzuriteStorage(StorageContract):
    @pytest.fixture
    def storage(self, azure_storage: AzureStorage) -> AzureStorage:
        return azure_storage

