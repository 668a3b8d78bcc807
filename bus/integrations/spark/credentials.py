"""How Spark jobs sign their storage requests: the platforms hand out credentials their own way.

* a connection string (holds the account key; Azurite's too);
* ``account_name`` with Entra ID: ``DefaultAzureCredential`` on the driver and every executor
  (a managed identity, or a service principal's environment variables);
* ``account_name`` with ``sas_token``: a shared access signature (scoped, expiring);
* ``account_name`` with ``token``: a bearer token for Azure Storage handed out by the
  platform (``notebookutils.credentials.getToken("storage")`` on Fabric and Synapse), used
  until it expires;
* ``account_name`` with ``credential_provider``: a function returning an Azure credential,
  called once in each process that needs one (the driver, each Python worker): Databricks'
  Unity Catalog service credentials (``dbutils.credentials.getServiceCredentialsProvider``),
  or anything else ``azure-identity`` can build. In the Python API the function itself; in a
  data source option its path, ``package.module:function``, importable on the executors.

``endpoints`` replaces the public cloud's service URLs (a sovereign cloud, private DNS,
Azurite): ``blob=https://...;queue=https://...;table=https://...``.
"""

from __future__ import annotations

import base64
import binascii
import json
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
