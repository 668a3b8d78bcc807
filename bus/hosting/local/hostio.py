"""The local host's own blocking storage calls, on a thread pool of their own.

In Azure the host (.NET) and the worker (Python) are separate processes: the host's queue
polling and Durable bookkeeping never take a thread from the Python process. Here they share
one process, so the host side gets its own executor and the event loop's default executor is
left as the worker process has it (Python's default, ``min(32, cpus + 4)`` threads), which is
what an async function's ``asyncio.to_thread`` gets in Azure.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from azure.storage.blob import BlobServiceClient
from azure.storage.queue import ExponentialRetry, QueueServiceClient

T = TypeVar("T")

_EXECUTOR = ThreadPoolExecutor(max_workers=32, thread_name_prefix="devhost-io")


async def host_io(call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a blocking host-side call (a storage request) off the event loop."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_EXECUTOR, functools.partial(call, *args, **kwargs))


def host_retry() -> ExponentialRetry:
    """The host's storage clients retry about as Azure.Core's defaults do (3 retries, 0.8 s
    then exponential: about 6 s in all), not as the Python SDK's (from 15 s: about a minute),
    so a listener sees an outage in seconds and backs off itself. Python's policy waits
    ``initial_backoff + increment_base ** n`` (whole seconds): 1, 3, 5 s."""
    return ExponentialRetry(initial_backoff=1, increment_base=2, retry_total=3,
                            random_jitter_range=1)


@dataclass(frozen=True)
class Connection:
    """A storage connection as the host reads it from app settings ``<name>``: a connection
    string, or an identity-based connection (``<name>__accountName``, or the
    ``__queueServiceUri`` / ``__blobServiceUri`` pair) with ``DefaultAzureCredential``, which
    takes ``<name>__clientId`` for a user-assigned managed identity and otherwise your
    ``az login`` locally."""

    name: str
    connection_string: str | None = None
    queue_uri: str | None = None
    blob_uri: str | None = None
    client_id: str | None = None

    @classmethod
    def from_settings(cls, name: str, settings: Mapping[str, str]) -> Connection:
        value = settings.get(name)
        if value:
            return cls(name, connection_string=value)
        account = settings.get(f"{name}__accountName")
        queue_uri = settings.get(f"{name}__queueServiceUri") or (
            f"https://{account}.queue.core.windows.net" if account else None)
        blob_uri = settings.get(f"{name}__blobServiceUri") or (
            f"https://{account}.blob.core.windows.net" if account else None)
        if not (queue_uri and blob_uri):
            raise SystemExit(
                f"local host: app setting {name!r} is missing: put a connection string in "
                f"local.settings.json (Values) or the environment, or set "
                f"'{name}__accountName' to connect with your Azure identity")
        return cls(name, queue_uri=queue_uri, blob_uri=blob_uri,
                   client_id=settings.get(f"{name}__clientId"))

    def queue_service(self) -> QueueServiceClient:
        if self.connection_string:
            return QueueServiceClient.from_connection_string(self.connection_string,
                                                             retry_policy=host_retry())
        return QueueServiceClient(str(self.queue_uri), self._credential(),
                                  retry_policy=host_retry())

    def blob_service(self) -> BlobServiceClient:
        if self.connection_string:
            return BlobServiceClient.from_connection_string(self.connection_string,
                                                            retry_policy=host_retry())
        return BlobServiceClient(str(self.blob_uri), self._credential(),
                                 retry_policy=host_retry())

    def _credential(self) -> Any:
        from azure.identity import DefaultAzureCredential

        return DefaultAzureCredential(managed_identity_client_id=self.client_id)
