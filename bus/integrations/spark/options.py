"""The options of the Spark integration: parsed once, from Spark's string options or keywords.

Spark hands a data source its options as strings (case-insensitive names); the Spark 3.4
functions take the same names as keyword arguments. Both end up here, so the two APIs cannot
drift apart. Every object here is picklable: Spark ships it to the executors.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from azure.core.credentials import AzureSasCredential
from pydantic import ValidationError

from bus.adapters.select import open_storage
from bus.bus import Bus
from bus.encryption import Encryption, EncryptionKey
from bus.errors import BusError, ConfigurationError, NamingError
from bus.integrations.spark.credentials import (
    PLATFORMS,
    Credential,
    CredentialProvider,
    PlatformError,
    StaticToken,
    parse_endpoints,
    platform_credential,
)
from bus.messages import Command, Event, Message, topic_of
from bus.naming import check_endpoint
from bus.settings import Settings
from bus.signing import Signing, SigningKey, keys_from_text, sources_from_text
from bus.storage import Storage


class OptionError(BusError, ValueError):
    """An option is missing or wrong; the message names it and says what to do."""


_RUN_KEY = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_PLATFORM = re.compile(r"^(databricks:[A-Za-z0-9_.-]+|synapse|fabric)$")
SIGNERS = ("sas_token", "token", "platform_credential", "credential_provider")
"""The ways to sign requests with ``account_name``: at most one is given."""


@dataclass(frozen=True)
class Connection:
    """Where the bus lives and how requests are signed (``credentials``): a connection string,
    or an account (or its ``endpoints``) with Entra ID - ``DefaultAzureCredential``, a
    ``token`` the platform handed out, the platform's own credential (``platform_credential``)
    or a ``credential_provider`` - or with a ``sas_token``; plus the installation's
    ``prefix``."""

    connection_string: str | None = field(default=None, repr=False)  # holds the key
    account_name: str | None = None
    prefix: str = ""
    settings: Settings | None = field(default=None, repr=False)  # may hold signing keys
    """The bus's settings: the signing and encryption keys of the app it talks to
    (docs/signing.md); the defaults when None."""
    sas_token: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    credential_provider: CredentialProvider | str | None = field(default=None, repr=False)
    """A function returning a credential, or its path ``package.module:function``."""
    platform_credential: str | None = None
    """``databricks:<service credential name>``, ``synapse`` or ``fabric``
    (``credentials.platform_credential``)."""
    endpoints: str | None = None
    """``blob=<url>;queue=<url>;table=<url>``: service URLs other than the public cloud's."""

    def __post_init__(self) -> None:
        account = self.account_name is not None or self.endpoints is not None
        if (self.connection_string is None) == (not account):
            raise OptionError("give exactly one of the options 'connection_string' and "
                              "'account_name' (or 'endpoints')")
        signers = [n for n in SIGNERS if getattr(self, n) is not None]
        if self.connection_string is not None and signers:
            raise OptionError(f"{signers[0]} goes with 'account_name', not with "
                              "'connection_string' (which holds the account key)")
        if len(signers) > 1:
            raise OptionError(f"give at most one of {', '.join(signers)}")
        if self.endpoints is not None:
            try:
                parse_endpoints(self.endpoints)
            except ValueError as exc:
                raise OptionError(str(exc)) from None
        spec = self.platform_credential
        if spec is not None and not _PLATFORM.match(spec):
            raise OptionError(f"platform_credential {spec!r}: give one of "
                              f"{', '.join(PLATFORMS)}")

    def storage(self) -> Storage:
        from bus.adapters.azure import AzureStorage

        if self.connection_string is not None:
            try:
                return open_storage(self.connection_string,
                                    name="the option 'connection_string'")
            except ConfigurationError as exc:
                raise OptionError(str(exc)) from None
        credential = self.credential()
        if self.endpoints is not None:
            return AzureStorage.from_endpoints(parse_endpoints(self.endpoints), credential)
        assert self.account_name is not None
        return AzureStorage.from_account(self.account_name, credential)

    def credential(self) -> Credential | None:
        """The credential this process signs with (None: DefaultAzureCredential)."""
        if self.sas_token is not None:
            return AzureSasCredential(self.sas_token.lstrip("?"))
        if self.token is not None:
            return StaticToken(self.token)
        if self.platform_credential is not None:
            try:
                return platform_credential(self.platform_credential)
            except PlatformError as exc:
                raise OptionError(str(exc)) from exc
        provider = self.credential_provider
        if isinstance(provider, str):
            provider = _load_function(provider)
        return None if provider is None else provider()

    def bus(self, routes: Mapping[type[Message] | str, str] | None = None,
            storage: Storage | None = None) -> Bus:
        return Bus(storage or self.storage(), prefix=self.prefix, routes=routes,
                   settings=self.settings)


def _load_function(path: str) -> CredentialProvider:
    module_name, sep, name = path.partition(":")
    if not sep:
        raise OptionError(f"credential_provider {path!r}: write it as 'package.module:function'")
    try:
        found = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise OptionError(f"credential_provider {path!r} cannot be imported ({exc}); is the "
                          "module installed on the driver and on every executor?") from exc
    if not callable(found):
        raise OptionError(f"credential_provider {path!r} is not a function")
    return found  # type: ignore[no-any-return]


Contract = str | type[Message]
"""A message contract as the options carry it: the class itself (a class defined in a notebook
travels to the executors with the job, pickled by value), or its path ``module:ClassName``
(imported where it is needed)."""


def resolve_contract(contract: Contract) -> type[Message]:
    """The contract class: the class itself, or the one its path names."""
    if isinstance(contract, str):
        return load_message_class(contract)
    return check_message_class(contract, repr(contract))


def load_message_class(path: str) -> type[Message]:
    """The contract class named ``module:ClassName`` (or ``module.ClassName``)."""
    module_name, sep, class_name = path.partition(":")
    if not sep:
        module_name, _, class_name = path.rpartition(".")
    if not module_name or not class_name:
        raise OptionError(f"message_type {path!r}: write it as 'package.module:ClassName'")
    try:
        found = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise OptionError(f"message_type {path!r} cannot be imported ({exc}); is the module "
                          "installed on the driver and on every executor? A class defined in "
                          "a notebook: pass the class itself (bus.spark.publish), or register "
                          "it (bus.spark.register(spark, contracts=[...]))") from exc
    return check_message_class(found, path)


def check_message_class(found: object, name: str) -> type[Message]:
    if not (isinstance(found, type) and issubclass(found, (Command, Event))):
        raise OptionError(f"message_type {name!r} is not a bus Command or Event class")
    return found


def class_path(contract: type[Message]) -> str:
    return f"{contract.__module__}:{contract.__qualname__}"


@dataclass(frozen=True)
class WriteOptions:
    """What a write sends, where, and how message ids are made."""

    connection: Connection
    message_class: Contract
    destination: str | None = None
    key_columns: tuple[str, ...] = ()
    """The column(s) whose values identify each row's message (its id is a hash of them)."""
    run_key: str | None = None
    """Scopes the message ids: the same key under another run key is another message."""
    parallelism: int = 4
    """Chunks of rows a task sends at once."""
    invalid_rows: str = "fail"
    """A row that is not a valid message: "fail" the job, or "report" it in the result."""

    def contract(self) -> type[Message]:
        return resolve_contract(self.message_class)

    def check(self) -> None:
        """Fail on the driver, before any task runs, when the options cannot work."""
        contract = self.contract()
        if issubclass(contract, Command) and self.destination is None:
            raise OptionError(f"{contract.message_type} is a command: set the option "
                              "'destination' to the endpoint that handles it")
        if issubclass(contract, Event) and self.destination is not None:
            raise OptionError(f"{contract.message_type} is an event, published to its topic: "
                              "drop the option 'destination'")
        if self.destination is not None:
            _endpoint("destination", self.destination)
        if not self.key_columns:
            raise OptionError(
                "set 'key_column' (a column whose value identifies each row's message) or "
                "'key_columns' (the columns that do, comma-separated): each message id is a "
                "hash of them. Ids from row positions are refused: Spark does not keep rows "
                "in place from one run to the next (file splits follow the cluster's cores, "
                "adaptive execution coalesces partitions, ties in a sort come out in any "
                "order), so a re-run would send rows again under other ids")
        if self.invalid_rows not in ("fail", "report"):
            raise OptionError(f"invalid_rows {self.invalid_rows!r}: 'fail' (the default) or "
                              "'report' (counted and described in the write's result)")
        if self.run_key is not None and not _RUN_KEY.match(self.run_key):
            raise OptionError(f"run_key {self.run_key!r}: use 1-64 letters, digits, '_' or '-'")
        if self.parallelism < 1:
            raise OptionError("parallelism must be at least 1")

    def routes(self) -> dict[type[Message] | str, str]:
        contract = self.contract()
        return {contract: self.destination} if self.destination is not None else {}


@dataclass(frozen=True)
class ReadOptions:
    """What a read drains (``endpoint``), how much, and how it parses payloads."""

    connection: Connection
    endpoint: str
    message_class: Contract | None = None
    max_messages: int = 10_000  # batch reads: at most this many messages
    max_rows_per_trigger: int | None = None  # streaming reads: per micro-batch; None: all
    partitions: int = 1  # input partitions of a batch read or a micro-batch
    lease_seconds: float = 300.0
    subscribe: tuple[str, ...] = ()
    run_key: str | None = None  # batch reads: the staging key
    consumer: str | None = None  # streaming reads: the stable consumer name
    poll_seconds: float = 1.0
    columns: tuple[tuple[str, str], ...] | None = None
    """The columns of a user-supplied schema (``columns.select``); None: every column."""

    def contract(self) -> type[Message] | None:
        return None if self.message_class is None else resolve_contract(self.message_class)

    def check(self, *, streaming: bool) -> None:
        _endpoint("endpoint", self.endpoint)
        if streaming and (self.consumer is None or not _RUN_KEY.match(self.consumer)):
            raise OptionError("a streaming read needs the option 'consumer': a stable name "
                              "(1-64 letters, digits, '_' or '-') that only this query uses")
        if not streaming and (self.run_key is None or not _RUN_KEY.match(self.run_key)):
            raise OptionError("a batch read needs the option 'run_key' (1-64 letters, digits, "
                              "'_' or '-'): a re-run with the same run key reads the same "
                              "messages")
        if not 1 <= self.max_messages <= 100_000:
            raise OptionError("max_messages must be between 1 and 100000")
        if self.max_rows_per_trigger is not None and self.max_rows_per_trigger < 1:
            raise OptionError("max_rows_per_trigger must be at least 1")
        if not 1 <= self.partitions <= 1_000:
            raise OptionError("partitions must be between 1 and 1000")
        if self.lease_seconds < 30:
            raise OptionError("lease_seconds must be at least 30")
        self.contract()


def _endpoint(option: str, name: str) -> str:
    try:
        return check_endpoint(name)
    except NamingError as exc:
        raise OptionError(f"{option}: {exc}") from exc


# -- from Spark's string options -------------------------------------------------------------
def connection_from(options: Mapping[str, str]) -> Connection:
    return Connection(connection_string=options.get("connection_string") or None,
                      account_name=options.get("account_name") or None,
                      prefix=options.get("prefix", ""), settings=sealing_from(options),
                      sas_token=options.get("sas_token") or None,
                      token=options.get("token") or None,
                      credential_provider=options.get("credential_provider") or None,
                      platform_credential=options.get("platform_credential") or None,
                      endpoints=options.get("endpoints") or None)


def sealing_from(options: Mapping[str, str]) -> Settings | None:
    """Settings with the signing and encryption the options name (docs/signing.md,
    "Spark"): ``signing`` (the mode), ``signing_key_id``, ``signing_keys``
    (``kid=<base64>;...``), ``signing_sources`` (``kid=source,source;...``),
    ``encryption_key_id``, ``encryption_keys``; None when none is set."""
    names = ("signing", "signing_key_id", "signing_keys", "signing_sources",
             "encryption_key_id", "encryption_keys")
    if not any(options.get(name) for name in names):
        return None
    try:
        sources = dict(item.partition("=")[::2] for item in
                       options.get("signing_sources", "").split(";") if item.strip())
        signing = Signing(
            mode=options.get("signing") or "off",
            keys=tuple(SigningKey(key_id=k, secret=s, sources=sources_from_text(
                sources.get(k, ""))) for k, s in keys_from_text(
                    options.get("signing_keys", ""), "signing_keys").items()),
            key_id=options.get("signing_key_id") or None)
        encryption = Encryption(
            keys=tuple(EncryptionKey(key_id=k, secret=s) for k, s in keys_from_text(
                options.get("encryption_keys", ""), "encryption_keys").items()),
            key_id=options.get("encryption_key_id") or None)
    except (ValueError, ValidationError) as exc:  # the message names the option
        raise OptionError(f"signing/encryption options: {exc}") from None
    return Settings(signing=signing, encryption=encryption)


def write_options(options: Mapping[str, str],
                  contracts: Mapping[str, type[Message]] | None = None) -> WriteOptions:
    """``contracts``: classes registered by name (``bus.spark.register``), found before any
    import is tried."""
    message_type = options.get("message_type")
    if not message_type:
        raise OptionError("set the option 'message_type' to the contract class, as "
                          "'package.module:ClassName'")
    opts = WriteOptions(
        connection=connection_from(options),
        message_class=_registered(message_type, contracts) or message_type,
        destination=options.get("destination") or None,
        key_columns=key_columns(options.get("key_column"), options.get("key_columns")),
        run_key=options.get("run_key") or None, parallelism=_int(options, "parallelism", 4),
        invalid_rows=options.get("invalid_rows") or "fail")
    opts.check()
    topic = options.get("topic")
    contract = opts.contract()
    if topic and not (issubclass(contract, Event) and topic_of(contract) == topic):
        raise OptionError(f"topic {topic!r}: {contract.message_type} is published to the topic "
                          f"of its type ({contract.message_type!r}) and only there")
    return opts


def key_columns(key_column: str | None, columns: str | Sequence[str] | None,
                ) -> tuple[str, ...]:
    """The key columns from ``key_column`` (one) or ``key_columns`` (comma-separated, or a
    list), not both."""
    if key_column and columns:
        raise OptionError("set 'key_column' or 'key_columns', not both")
    if key_column:
        return (key_column,)
    if isinstance(columns, str):
        columns = columns.split(",")
    return tuple(c.strip() for c in columns or () if c.strip())


def read_options(options: Mapping[str, str], *, streaming: bool,
                 contracts: Mapping[str, type[Message]] | None = None) -> ReadOptions:
    endpoint = options.get("endpoint")
    if not endpoint:
        raise OptionError("set the option 'endpoint': the bus endpoint whose queue to read")
    per_trigger = [name for name in ("max_rows_per_trigger", "batch_size") if options.get(name)]
    if len(per_trigger) > 1:
        raise OptionError("give max_rows_per_trigger or batch_size (its old name), not both")
    opts = ReadOptions(
        connection=connection_from(options), endpoint=endpoint,
        message_class=_registered(options.get("message_type") or None, contracts),
        max_messages=_int(options, "max_messages", 10_000),
        max_rows_per_trigger=_int(options, per_trigger[0], 0) if per_trigger else None,
        partitions=_int(options, "partitions", 1),
        lease_seconds=_float(options, "lease_seconds", 300.0),
        subscribe=tuple(t.strip() for t in options.get("subscribe", "").split(",") if t.strip()),
        run_key=options.get("run_key") or None, consumer=options.get("consumer") or None,
        poll_seconds=_float(options, "poll_seconds", 1.0))
    opts.check(streaming=streaming)
    return opts


def _registered(name: str | None,
                contracts: Mapping[str, type[Message]] | None) -> Contract | None:
    return None if name is None else (contracts or {}).get(name, name)


def _int(options: Mapping[str, str], name: str, default: int) -> int:
    return int(_number(options, name, default))


def _float(options: Mapping[str, str], name: str, default: float) -> float:
    return float(_number(options, name, default))


def _number(options: Mapping[str, str], name: str, default: float) -> Any:
    raw = options.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw) if "." in str(raw) else int(raw)
    except ValueError as exc:
        raise OptionError(f"option {name!r} must be a number, not {raw!r}") from exc

