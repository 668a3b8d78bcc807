"""Stand-in for Fabric's ``notebookutils`` (``credentials.getToken("storage")``) and Synapse's
``notebookutils.mssparkutils`` (``credentials.getToken("Storage")``), with the audiences each
documents."""

from __future__ import annotations

from types import SimpleNamespace

import standin


def _token(api: str, audiences: tuple[str, ...]) -> SimpleNamespace:
    def get_token(audience: str) -> str:
        standin.record(api, audience)
        if audience not in audiences:  # the platforms refuse an audience they do not know
            raise ValueError(f"unknown audience {audience!r}")
        return standin.token()

    return SimpleNamespace(getToken=get_token)


credentials = _token("notebookutils.credentials", ("storage", "pbi", "keyvault", "kusto"))
mssparkutils = SimpleNamespace(credentials=_token(
    "mssparkutils.credentials", ("Storage", "Vault", "AzureManagement", "DW", "Synapse")))
