"""Stand-in for the two Databricks modules the recipe calls, as one file (Spark ships single
``.py`` files to every Python worker, the data source's planner workers included):

* ``databricks.service_credentials.getServiceCredentialsProvider(name)`` - what Databricks
  documents for UDFs (an Azure credential);
* ``databricks.sdk.runtime.dbutils.credentials.getServiceCredentialsProvider(name)`` - the
  notebook's ``dbutils``, on the driver.
"""

from __future__ import annotations

import sys
from types import ModuleType, SimpleNamespace

import standin


def _service_credential(api: str) -> object:
    def get(name: str) -> standin.Credential:
        standin.record(api, name)
        return standin.Credential()

    return get


def _module(name: str, **attributes: object) -> ModuleType:
    module = ModuleType(name)
    module.__dict__.update(attributes)
    sys.modules[name] = module  # ``import databricks.sdk.runtime`` finds it here
    return module


__path__: list[str] = []  # a package, so that its submodules can be imported
service_credentials = _module("databricks.service_credentials",
                              getServiceCredentialsProvider=_service_credential(
                                  "databricks.service_credentials"))
sdk = _module("databricks.sdk", __path__=[])
sdk.runtime = _module("databricks.sdk.runtime", dbutils=SimpleNamespace(  # type: ignore[attr-defined]
    credentials=SimpleNamespace(getServiceCredentialsProvider=_service_credential(
        "dbutils.credentials"))))
