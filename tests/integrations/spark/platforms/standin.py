"""What the stand-ins share: tokens for Azurite, the test's trust in its certificate, and a
record of each call (the API, the driver or a task, its argument, the process)."""

from __future__ import annotations

import os
import time
from typing import Any

import standin_config  # type: ignore[import-not-found]  # the test writes it beside this file

# The platform's processes trust Azure's certificates; the stand-in platform trusts the test's.
os.environ["REQUESTS_CA_BUNDLE"] = standin_config.CA


def record(api: str, argument: str) -> None:
    from pyspark import TaskContext

    where = "task" if TaskContext.get() is not None else "driver"
    with open(standin_config.CALLS, "a", encoding="utf-8") as calls:
        calls.write(f"{api} {where} {argument} {os.getpid()}\n")


def token() -> str:
    """A bearer token for Azure Storage that Azurite takes, living ``LIFETIME`` seconds."""
    from standin_tls import bearer_token  # tests/support/tls.py, copied beside this file

    return bearer_token(standin_config.LIFETIME)


class Credential:
    """An Azure ``TokenCredential``, as a Databricks service credential for Azure is used."""

    def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        from azure.core.credentials import AccessToken

        return AccessToken(token(), int(time.time() + standin_config.LIFETIME))
