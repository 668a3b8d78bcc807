"""How Spark jobs sign their storage requests: the platforms hand out credentials their own way.

* a connection string (holds the account key; Azurite's too);
* ``account_name`` with Entra ID: ``DefaultAzureCredential`` on the driver and every executor
  (a managed identity, or a service principal's environment variables);
* ``account_name`` with ``sas_token``: a shared access signature (scoped, expiring);
* ``account_name`` with ``token``: a bearer token for Azure Storage handed out by the
  platform (``notebookutils.credentials.getToken("storage")`` on Fabric and Synapse), used
  until it expires;
* ``account_name`` with ``platform_credential``: the platform's own credential, asked for in
  each process that signs (the driver and every Python worker), fresh tokens fetched before
  the old ones expire (:func:`platform_credential`): ``databricks:<service credential>``,
  ``synapse``, ``fabric``;
* ``account_name`` with ``credential_provider``: a function returning an Azure credential,
  called once in each process that needs one (the driver, each Python worker): anything
  ``azure-identity`` can build. In the Python API the function itself; in a data source
  option its path, ``package.module:function``, importable on the executors.

``endpoints`` replaces the public cloud's service URLs (a sovereign cloud, private DNS,
Azurite): ``blob=https://...;queue=https://...;table=https://...``.
"""

from __future__ import annotations

import base64
import binascii
import importlib
import json
import threading
import time
from collections.abc import Callable
from typing import Any

from azure.core.credentials import AccessToken, AzureSasCredential, TokenCredential

Credential = TokenCredential | AzureSasCredential
CredentialProvider = Callable[[], Credential]
_DEFAULT_LIFETIME = 3600.0  # a token whose expiry cannot be read is trusted this long


class StaticToken:
    """A bearer token handed out by the platform, as an Azure ``TokenCredential``. It is not
    refreshed: a job running past its expiry fails with an authentication error (use a
    ``credential_provider`` for long jobs)."""

    def __init__(self, token: str) -> None:
        self._token = token
        self._expires = _expiry(token) or time.time() + _DEFAULT_LIFETIME

    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        return AccessToken(self._token, int(self._expires))

    @property
    def expires_on(self) -> float:
        return self._expires


class RefreshingToken:
    """Bearer tokens from ``fetch`` (a platform's ``getToken``), as an Azure
    ``TokenCredential``: a token is used until ``margin`` seconds before its expiry (its
    ``exp`` claim), then ``fetch`` is called for a new one - so a job may run for longer than
    a token lives. (The SDK's own bearer-token policy also asks again five minutes before
    the expiry the credential reported.)"""

    def __init__(self, fetch: Callable[[], str], *, margin: float = 300.0,
                 clock: Callable[[], float] = time.time) -> None:
        self._fetch = fetch
        self._margin = margin
        self._clock = clock
        self._lock = threading.Lock()
        self._token: AccessToken | None = None

    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        with self._lock:
            now = self._clock()
            if self._token is None or now >= self._token.expires_on - self._margin:
                text = self._fetch()
                if not isinstance(text, str) or not text:
                    raise PlatformError(f"the platform's getToken returned {text!r}, not a "
                                        "token")
                self._token = AccessToken(text, int(_expiry(text) or now + _DEFAULT_LIFETIME))
            return self._token


class PlatformError(RuntimeError):
    """The platform's credential call is not there or did not answer (the message says which
    platform, which call, and what to do instead)."""


PLATFORMS = ("databricks:<service credential name>", "synapse", "fabric")


def platform_credential(spec: str) -> Credential:
    """The credential of the platform ``spec`` names, for the process calling it (the driver
    or a Python worker on an executor):

    * ``databricks:<name>`` - the Unity Catalog service credential ``<name>``: in a task,
      ``databricks.service_credentials.getServiceCredentialsProvider(name)`` (what Databricks
      documents for UDFs; Databricks Runtime 16.2 and later), on the driver
      ``dbutils.credentials.getServiceCredentialsProvider(name)``;
    * ``synapse`` - ``mssparkutils.credentials.getToken("Storage")`` (the workspace's managed
      identity, or the user running the notebook), refreshed before it expires;
    * ``fabric`` - ``notebookutils.credentials.getToken("storage")``, refreshed likewise.

    Raises PlatformError when the platform's module is not importable in this process.
    """
    platform, _, name = spec.partition(":")
    if platform == "databricks" and name:
        return _databricks(name)
    if platform == "synapse" and not name:
        get_token = _function("notebookutils", "mssparkutils.credentials.getToken", spec)
        return RefreshingToken(lambda: get_token("Storage"))
    if platform == "fabric" and not name:
        get_token = _function("notebookutils", "credentials.getToken", spec)
        return RefreshingToken(lambda: get_token("storage"))
    raise PlatformError(f"platform_credential {spec!r}: give one of {', '.join(PLATFORMS)}")


def _databricks(name: str) -> Credential:
    """In a task, the API Databricks documents for UDFs; on the driver, ``dbutils``'s (or, in
    a driver-side process without the notebook's ``dbutils``, the UDFs' API)."""
    spec = f"databricks:{name}"
    in_udfs = ("databricks.service_credentials", "getServiceCredentialsProvider", spec)
    if _in_task():
        provider = _function(*in_udfs)(name)
    else:
        try:
            provider = _function("databricks.sdk.runtime",
                                 "dbutils.credentials.getServiceCredentialsProvider", spec)(name)
        except PlatformError as missing:
            try:
                provider = _function(*in_udfs)(name)
            except PlatformError:
                raise missing from None
    if not hasattr(provider, "get_token"):
        raise PlatformError(f"platform_credential {spec!r}: the service credential is a "
                            f"{type(provider).__name__}, not an Azure credential (is it an "
                            "Azure managed identity credential?)")
    return provider  # type: ignore[no-any-return]


def _function(module_name: str, path: str, spec: str) -> Callable[[str], Any]:
    """``module.path``, imported now (so that a process without the platform's module fails
    before its first request, with an error that says what is missing where)."""
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        where = "a task on an executor" if _in_task() else "the driver"
        raise PlatformError(
            f"platform_credential {spec!r}: {module_name} cannot be imported in this process "
            f"({where}: {exc}). It exists only on the platform; where its tasks cannot call "
            "it, pass token= (fetched on the driver, used until it expires) or sas_token= "
            "instead (docs/spark.md, \"Connection\")") from exc
    for part in path.split("."):
        try:
            target = getattr(target, part)
        except AttributeError as exc:
            raise PlatformError(f"platform_credential {spec!r}: {module_name} has no "
                                f"{path} ({exc})") from exc
    return target  # type: ignore[no-any-return]


def _in_task() -> bool:
    try:
        from pyspark import TaskContext
    except ImportError:
        return False
    return TaskContext.get() is not None


def _expiry(token: str) -> float | None:
    """The ``exp`` claim of a JWT (unverified: only to know when to stop using it)."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, binascii.Error):
        return None
    exp = claims.get("exp") if isinstance(claims, dict) else None
    return float(exp) if isinstance(exp, (int, float)) else None


def parse_endpoints(text: str) -> dict[str, str]:
    """``blob=<url>;queue=<url>;table=<url>`` as a mapping."""
    found: dict[str, str] = {}
    for item in text.split(";"):
        name, sep, url = item.strip().partition("=")
        if item.strip() and (not sep or name.strip() not in ("blob", "queue", "table")):
            raise ValueError(f"endpoints: {item.strip()!r} is not blob=, queue= or table=<url>")
        if sep:
            found[name.strip()] = url.strip()
    return found
