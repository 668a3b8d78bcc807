"""Hosting the bus in Azure Functions (Python v2 programming model, Durable Functions).

    from bus.hosting.functions import BusFunctions

    app = df.DFApp(http_auth_level=func.AuthLevel.FUNCTION)
    app.register_functions(BusFunctions([orders, billing, shipping]))

Needs the ``azure-functions`` and ``azure-functions-durable`` packages (in requirements.txt);
the rest of ``bus`` does not import them.
"""

from bus.hosting.functions.app import BusFunctions, instance_id, trigger_function_name
from bus.hosting.functions.config import AppConfig

__all__ = ["AppConfig", "BusFunctions", "instance_id", "trigger_function_name"]
