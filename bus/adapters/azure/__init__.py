"""The Azure Storage adapter: the storage ports over the official Python SDKs.

Connect with a connection string (Azurite: ``UseDevelopmentStorage=true`` or an explicit one)
or with an account name and Entra ID (DefaultAzureCredential)::

    storage = AzureStorage.from_connection_string(os.environ["AzureWebJobsStorage"])
    storage = AzureStorage.from_account("mystorageaccount")

The SDKs' automatic retries are turned off (``retry_total=0``): a retried conditional request
whose first try took effect comes back as 409/412, and a slow first try can land after its
retry. The protocol retries itself, knowing which outcomes are ambiguous (see docs/protocol.md).
"""

from bus.adapters.azure.store import AzureStorage

__all__ = ["AzureStorage"]
