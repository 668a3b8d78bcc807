"""Queues, blobs and tables on Azure Storage (or Azurite)."""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import re
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from azure.core import MatchConditions
from azure.core.credentials import AzureSasCredential, TokenCredential
from azure.core.exceptions import (
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.core.pipeline.transport import RequestsTransport
from azure.data.tables import EdmType, EntityProperty, TableServiceClient, UpdateMode
from azure.storage.blob import BlobServiceClient
from azure.storage.queue import QueueServiceClient
from requests.adapters import HTTPAdapter

from bus.adapters.azure import queries, transactions
from bus.adapters.azure.http import LeanSession
from bus.storage.errors import (
    Conflict,
    Missing,
    NotFound,
    PreconditionFailed,
    Refused,
    Throttled,
    TooLarge,
    TransientError,
)
from bus.storage.limits import AZURE, StorageLimits, check_entity, check_message
from bus.storage.ports import Blob, Entity, EntityValue, QueueMessage, Storage, TableOp

_NO_SDK_RETRIES: dict[str, Any] = {"retry_total": 0}
CONNECTIONS_PER_HOST = 64
"""Connections kept open to each storage endpoint: as many as requests run at once - the
Functions app's delivery threads (32 by default) and a client's send groups together. With
urllib3's default of 10, each request beyond the tenth opened a connection and threw it away
afterwards ("Connection pool is full, discarding connection"): a new TCP (and TLS) handshake
the next time."""


def _client_options() -> dict[str, Any]:
    """Options of every SDK client: no SDK retries (see docs/protocol.md), and a transport
    that reads the proxy settings once instead of on every request.

    ``requests`` with ``trust_env`` re-reads the environment's proxy variables and ~/.netrc for
    each request: about a third of the SDK's CPU per request on a small machine (measured:
    3.1 -> 2.1 ms per queue send). The proxies in the environment when the client is built
    still apply; netrc credentials never should (requests are signed). So does a certificate
    bundle named by ``REQUESTS_CA_BUNDLE`` or ``CURL_CA_BUNDLE`` (as ``requests`` reads them:
    a proxy that inspects TLS, a private certificate authority).
    """
    session = LeanSession()
    session.trust_env = False
    session.proxies.update(urllib.request.getproxies())
    for scheme in ("https://", "http://"):
        session.mount(scheme, HTTPAdapter(pool_maxsize=CONNECTIONS_PER_HOST))
    bundle = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
    verify: dict[str, Any] = {"connection_verify": bundle} if bundle else {}
    return {**_NO_SDK_RETRIES, "transport": RequestsTransport(session=session,
                                                             session_owner=False, **verify)}
_KEYS = ("PartitionKey", "RowKey")


@contextmanager
def _translated() -> Iterator[None]:
    """Map SDK exceptions onto the port's errors, with any SAS signature (``sig=``) in their
    text redacted; an SDK error whose text held one is not chained (a logged traceback would
    print it)."""
    try:
        yield
    except Exception as exc:
        mapped = _mapped(exc)
        if mapped is None or mapped is exc:  # not the SDK's, or a status the port has not
            raise
        if _SIGNATURE.search(str(exc)):
            raise mapped from None
        raise mapped from exc


_SIGNATURE = re.compile(r"(?i)\bsig=[^&\s'\"<>]+")


def _redacted(text: str) -> str:
    return _SIGNATURE.sub("sig=REDACTED", text)


def _mapped(exc: Exception) -> Exception | None:
    """The port's error for an SDK exception (None: not the SDK's)."""
    text = _redacted(str(exc))
    if isinstance(exc, ResourceModifiedError):
        return PreconditionFailed(text)
    if isinstance(exc, ResourceNotFoundError):
        return _not_found(str(getattr(exc, "error_code", "") or ""), text)
    if isinstance(exc, ResourceExistsError):
        return Conflict(text)
    if isinstance(exc, (ServiceRequestError, ServiceResponseError)):
        return TransientError(text)
    if isinstance(exc, HttpResponseError):
        return _by_status(exc, text)
    if isinstance(exc, transactions.BatchRejected):
        return _status_error(exc.status, "", text, None, exc)
    if isinstance(exc, queries.QueryRejected):
        return _status_error(exc.status, exc.code, text, exc.retry_after, exc)
    if isinstance(exc, transactions.PayloadTooLarge):
        return TooLarge(text)
    return None


MISSING_CODES = ("QueueNotFound", "TableNotFound", "ContainerNotFound")
"""Storage error codes that say the queue, table or container itself is not there."""


def _not_found(code: str, text: str) -> NotFound:
    """Missing for an absent queue, table or container; NotFound for an absent item."""
    if any(missing in (code, text) or missing in text for missing in MISSING_CODES):
        return Missing(text)
    return NotFound(text)


def _by_status(exc: HttpResponseError, text: str) -> Exception:
    code = getattr(exc, "error_code", None)
    headers = getattr(exc.response, "headers", None) or {}
    return _status_error(exc.status_code or 0, str(getattr(code, "value", code) or ""),
                         text, headers.get("Retry-After"), exc)


def _status_error(status: int, code: str, text: str, retry_after: str | None,
                  unmapped: Exception) -> Exception:
    """The port's error for an HTTP status (and storage error code); ``unmapped`` when
    the status is none the port defines (a 401 or 403: the credentials, not the request)."""
    if status == 412:
        return PreconditionFailed(text)
    if status == 409:
        return Conflict(text)
    if status == 404 or "PopReceiptMismatch" in (code, text):  # a 400: the lease was lost
        return _not_found(code, text)
    if status == 413 or (status == 400 and "TooLarge" in f"{code} {text}"):
        return TooLarge(text)  # RequestBodyTooLarge, EntityTooLarge, PropertyValueTooLarge
    if status == 400:
        return Refused(text)  # InvalidInput, OutOfRangeInput, TooManyProperties, ...
    if status == 503 or (status == 500 and "busy" in f"{code} {text}".lower()):
        return Throttled(text, float(retry_after) if retry_after else None)
    if status >= 500 or status == 408:
        return TransientError(text)
    return unmapped


# The adapter checks entities, messages and a transaction's payload against its limits before
# sending: Azure refuses them all as well, but Azurite enforces only some of them
# (docs/protocol.md, "Limits and horizons"), and a check here makes both answer alike.


class AzureQueues:
    def __init__(self, service: QueueServiceClient, limits: StorageLimits = AZURE) -> None:
        self._service = service
        self.limits = limits
        self._clients: dict[str, Any] = {}

    def _client(self, queue: str) -> Any:
        # One client per queue, built once: building one costs a pipeline (clients are
        # thread-safe and share the service's transport).
        client = self._clients.get(queue)
        if client is None:
            client = self._clients.setdefault(queue, self._service.get_queue_client(queue))
        return client

    def create_queue(self, queue: str) -> None:
        try:
            with _translated():
                self._client(queue).create_queue()
        except Conflict:
            pass

    def send(self, queue: str, body: str, *, delay: float = 0.0) -> None:
        check_message(body, self.limits)  # the service would refuse it too (413)
        with _translated():
            self._client(queue).send_message(
                body, visibility_timeout=math.ceil(delay) if delay > 0 else None,
                time_to_live=-1)  # signals never expire: an expired signal is a lost message

    def receive(self, queue: str, *, max_messages: int, lease: float) -> list[QueueMessage]:
        with _translated():
            pages = self._client(queue).receive_messages(
                messages_per_page=max_messages, max_messages=max_messages,
                visibility_timeout=max(1, math.ceil(lease))).by_page()
            # One request: iterating the pager would fetch another page whenever the first
            # held fewer than max_messages (usually an empty one).
            return [QueueMessage(m.id, m.pop_receipt, m.content, m.dequeue_count)
                    for m in next(pages, [])]

    def delete(self, queue: str, message: QueueMessage) -> None:
        with _translated():
            self._client(queue).delete_message(message.id, message.pop_receipt)

    def extend(self, queue: str, message: QueueMessage, *, lease: float) -> QueueMessage:
        with _translated():
            updated = self._client(queue).update_message(
                message.id, message.pop_receipt, visibility_timeout=math.ceil(lease))
        return QueueMessage(message.id, updated.pop_receipt, message.body,
                            message.dequeue_count)

    def peek(self, queue: str, *, max_messages: int) -> list[str]:
        with _translated():
            return [m.content for m in
                    self._client(queue).peek_messages(max_messages=max_messages)]

    def depth(self, queue: str) -> int:
        with _translated():
            return int(self._client(queue).get_queue_properties().approximate_message_count)

    def oldest(self, queue: str) -> float | None:
        with _translated():
            peeked = self._client(queue).peek_messages(max_messages=1)
        inserted = peeked[0].inserted_on if peeked else None
        return inserted.timestamp() if inserted is not None else None


class AzureBlobs:
    def __init__(self, service: BlobServiceClient) -> None:
        self._service = service

    def create_container(self, container: str) -> None:
        try:
            with _translated():
                self._service.create_container(container)
        except Conflict:
            pass

    def read(self, container: str, name: str, *, max_bytes: int | None = None) -> Blob:
        client = self._service.get_blob_client(container, name)
        with _translated():
            if max_bytes is None:
                downloader = client.download_blob()
            else:
                try:  # a ranged read: never more than the limit and one byte
                    downloader = client.download_blob(offset=0, length=max_bytes + 1)
                except HttpResponseError as exc:
                    if exc.status_code != 416:  # 416: an empty blob has no byte 0
                        raise
                    downloader = client.download_blob()
            return Blob(downloader.readall(), str(downloader.properties.etag))

    def write(self, container: str, name: str, data: bytes, *, etag: str | None = None,
              create_only: bool = False) -> str:
        conditions: dict[str, Any] = {}
        if etag is not None:
            conditions = {"etag": etag, "match_condition": MatchConditions.IfNotModified}
        with _translated():
            result = self._service.get_blob_client(container, name).upload_blob(
                data, overwrite=not create_only, **conditions)
        return str(result["etag"])

    def delete(self, container: str, name: str) -> None:
        with _translated():
            self._service.get_blob_client(container, name).delete_blob()

    def list(self, container: str, prefix: str = "") -> list[str]:
        with _translated():
            client = self._service.get_container_client(container)
            return sorted(client.list_blob_names(name_starts_with=prefix or None))


class AzureTables:
    def __init__(self, service: TableServiceClient, limits: StorageLimits = AZURE) -> None:
        self._service = service
        self.limits = limits
        self._clients: dict[str, Any] = {}

    def _client(self, table: str) -> Any:
        client = self._clients.get(table)  # one per table, as for queues
        if client is None:
            client = self._clients.setdefault(table, self._service.get_table_client(table))
        return client

    def create_table(self, table: str) -> None:
        with _translated():
            self._service.create_table_if_not_exists(table)

    def get(self, table: str, partition_key: str, row_key: str) -> Entity:
        with _translated():
            return _entity(self._client(table).get_entity(partition_key, row_key))

    def get_many(self, table: str, partition_key: str,
                 row_keys: Sequence[str]) -> dict[str, Entity]:
        if not row_keys:
            return {}
        if len(row_keys) == 1:  # a point read is the cheapest request there is
            with contextlib.suppress(NotFound):
                return {row_keys[0]: self.get(table, partition_key, row_keys[0])}
            return {}
        found: dict[str, Entity] = {}
        # A filter may hold at most 15 comparisons: the partition key and 14 row keys.
        per_query = self.limits.keys_per_read
        for start in range(0, len(row_keys), per_query):
            chunk = row_keys[start:start + per_query]
            names = [f"r{i}" for i in range(len(chunk))]
            # Spaces around the parentheses: the SDK substitutes @names in space-split words.
            query = "PartitionKey eq @pk and ( " + " or ".join(
                f"RowKey eq @{name}" for name in names) + " )"
            parameters = {"pk": partition_key, **dict(zip(names, chunk, strict=True))}
            with _translated():
                page = queries.query(self._client(table), query, parameters)
                found.update((entity.row_key, entity) for entity in map(_entity, page.rows))
                if page.more:
                    # The service may end a page early (a page can even be empty): the rows
                    # of two pages are not one snapshot, which a claim relies on.
                    raise TransientError("the service answered in pages: not one snapshot")
        return found

    def insert(self, table: str, entity: Entity) -> str:
        check_entity(entity, self.limits)
        with _translated():
            return _etag(self._client(table).create_entity(_row(entity)))

    def replace(self, table: str, entity: Entity, *, etag: str | None = None) -> str:
        check_entity(entity, self.limits)
        with _translated():
            client = self._client(table)
            if etag is None:
                return _etag(client.upsert_entity(_row(entity), mode=UpdateMode.REPLACE))
            return _etag(client.update_entity(
                _row(entity), mode=UpdateMode.REPLACE, etag=etag,
                match_condition=MatchConditions.IfNotModified))

    def delete(self, table: str, partition_key: str, row_key: str, *,
               etag: str | None = None) -> None:
        conditions: dict[str, Any] = {}
        if etag is not None:
            conditions = {"etag": etag, "match_condition": MatchConditions.IfNotModified}
        with _translated():
            self._client(table).delete_entity(partition_key, row_key, **conditions)

    def transact(self, table: str, ops: Sequence[TableOp]) -> list[str]:
        for op in ops:
            if op.kind != "delete":
                check_entity(op.entity, self.limits)
        with _translated():
            parts = transactions.submit(self._client(table), [
                (op.kind, _row(op.entity), op.etag) for op in ops],
                max_bytes=self.limits.transaction_bytes)
        failed = [part for part in parts if not 200 <= part.status < 300]
        if failed or len(parts) != len(ops):
            raise _part_error(failed[0] if failed else None, len(parts), len(ops))
        return [part.headers.get("etag", "") if op.kind != "delete" else ""
                for op, part in zip(ops, parts, strict=True)]

    def query(self, table: str, partition_key: str | None = None,
              row_key: str | None = None, *, row_key_prefix: str | None = None,
              row_key_after: str | None = None, row_key_before: str | None = None,
              limit: int | None = None,
              ) -> list[Entity]:
        keys = {"PartitionKey": partition_key, "RowKey": row_key}
        terms = [f"{name} eq @{name}" for name, value in keys.items() if value is not None]
        parameters: dict[str, str] = {k: v for k, v in keys.items() if v is not None}
        if row_key_prefix:
            terms.append("RowKey ge @low and RowKey lt @high")
            parameters.update(low=row_key_prefix, high=_after_prefix(row_key_prefix))
        if row_key_after is not None:
            terms.append("RowKey gt @after")
            parameters.update(after=row_key_after)
        if row_key_before is not None:
            terms.append("RowKey lt @before")
            parameters.update(before=row_key_before)
        # ``$top``: the service answers pages of at most ``limit`` rows, and only the first
        # is read; a filter may still leave a page short, then the next one is asked for
        paging: dict[str, Any] = {"results_per_page": limit} if limit else {}
        with _translated():
            client = self._client(table)
            if not terms:
                rows = client.list_entities(**paging)
            else:
                rows = client.query_entities(" and ".join(terms), parameters=parameters,
                                             **paging)
            return [_entity(row) for row in itertools.islice(rows, limit)]


def _after_prefix(prefix: str) -> str:
    """The least string greater than every string starting with ``prefix``."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def _part_error(part: transactions.PartResponse | None, answers: int,
                operations: int) -> Exception:
    """The port's error for a transaction the service refused (none of it was applied)."""
    if part is None:
        return TransientError(f"a transaction of {operations} operations got {answers} "
                              "answers")
    code, message = transactions.error_of(part)
    text = f"HTTP {part.status} {code}: {message}"
    return _status_error(part.status, code, text, part.headers.get("retry-after"),
                         Refused(f"the service refused a transaction: {text}"))


def _row(entity: Entity) -> dict[str, Any]:
    return {"PartitionKey": entity.partition_key, "RowKey": entity.row_key,
            **{name: _typed(value) for name, value in entity.properties.items()}}


def _typed(value: EntityValue) -> Any:
    """An int outside Int32 goes as Edm.Int64 (the SDK refuses to guess and raises)."""
    if isinstance(value, int) and not isinstance(value, bool) and not (
            -(2**31) <= value < 2**31):
        return EntityProperty(value, EdmType.INT64)
    return value


def _entity(row: Any) -> Entity:
    properties: dict[str, EntityValue] = {
        k: v.value if isinstance(v, EntityProperty) else v  # Int64 comes back wrapped
        for k, v in row.items() if k not in _KEYS}
    return Entity(row["PartitionKey"], row["RowKey"], properties, str(row.metadata["etag"]))


def _etag(result: Any) -> str:
    return str(result.get("etag", ""))


_DEVELOPMENT_STORAGE = (
    "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=Eby8vdM02xNOcqFlqUwJ"
    "PLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;"
    "BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1;"
    "QueueEndpoint=http://127.0.0.1:10001/devstoreaccount1;"
    "TableEndpoint=http://127.0.0.1:10002/devstoreaccount1")
"""Azurite's well-known account on its default ports: what ``UseDevelopmentStorage=true``
stands for."""


def _spelled_out(connection_string: str) -> str:
    """``UseDevelopmentStorage=true`` as the connection string it stands for, which every SDK
    release reads: the queue and blob SDKs know the shorthand only from azure-storage-queue
    12.15 and azure-storage-blob 12.28 on, and the bus supports older ones (pyproject.toml)."""
    for part in connection_string.split(";"):
        name, _, value = part.partition("=")
        if name.strip().lower() == "usedevelopmentstorage" and value.strip().lower() == "true":
            return _DEVELOPMENT_STORAGE
    return connection_string


class AzureStorage(Storage):
    """The three ports over one storage account."""

    @classmethod
    def from_connection_string(cls, connection_string: str) -> AzureStorage:
        connection_string = _spelled_out(connection_string)
        return cls(
            AzureQueues(QueueServiceClient.from_connection_string(
                connection_string, **_client_options())),
            AzureBlobs(BlobServiceClient.from_connection_string(
                connection_string, **_client_options())),
            AzureTables(TableServiceClient.from_connection_string(
                connection_string, **_client_options())))

    @classmethod
    def from_account(cls, account: str,
                     credential: TokenCredential | AzureSasCredential | None = None,
                     suffix: str = "core.windows.net") -> AzureStorage:
        """Connect with Entra ID (DefaultAzureCredential unless given another credential), or
        with a SAS (``AzureSasCredential``)."""
        return cls.from_endpoints(
            {service: f"https://{account}.{service}.{suffix}"
             for service in ("blob", "queue", "table")}, credential)

    @classmethod
    def from_endpoints(cls, endpoints: Mapping[str, str],
                       credential: TokenCredential | AzureSasCredential | None = None,
                       ) -> AzureStorage:
        """Connect to the ``blob``, ``queue`` and ``table`` service URLs given (a private or
        sovereign cloud's, Azurite's) with ``credential`` (DefaultAzureCredential if None)."""
        missing = {"blob", "queue", "table"} - set(endpoints)
        if missing:
            raise ValueError(f"service endpoints missing: {', '.join(sorted(missing))}")
        if credential is None:
            from azure.identity import DefaultAzureCredential

            credential = DefaultAzureCredential()
        return cls(
            AzureQueues(QueueServiceClient(endpoints["queue"], credential,
                                           **_client_options())),
            AzureBlobs(BlobServiceClient(endpoints["blob"], credential, **_client_options())),
            AzureTables(TableServiceClient(endpoints["table"], credential=credential,
                                           **_client_options())))
