"""Hosting the bus in Azure Functions (Python v2 programming model, Durable Functions).

    from bus.hosting.functions import BusFunctions

    app = df.DFApp(http_auth_level=func.AuthLevel.FUNCTION)
    app.register_functions(BusFunctions([orders, billing, shipping]))

Needs the ``azure-functions`` and ``azure-functions-durable`` packages (in requirements.txt);
the rest of ``bus`` does not import them, and neither do ``bus.hosting.functions.trigger`` and
``.config``: the names below are imported when first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bus.hosting.functions.app import BusFunctions, instance_id, trigger_function_name
    from bus.hosting.functions.config import AppConfig

__all__ = ["AppConfig", "BusFunctions", "instance_id", "trigger_function_name"]


def __getattr__(name: str) -> Any:
    if name == "AppConfig":
        from bus.hosting.functions import config

        return config.AppConfig
    if name in __all__:
        from bus.hosting.functions import app

        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
