"""The benchmark's command hop as an Azure Functions app: ``bench-a`` handles ``Ping`` (one
state update, one ``Pong`` to ``bench-b``), hosted by the local host driving the real Python
worker (``python -m devhost --script-root bench/functions_app``). The Functions-path scenario
(``bench.scenarios.functions_hop``) runs it with ``BUS_ENDPOINTS=bench-a``."""

from __future__ import annotations

import azure.durable_functions as df

from bench.workload import hop_endpoints
from bus.hosting.functions import BusFunctions

app = df.DFApp()
bus_functions = BusFunctions(hop_endpoints())
app.register_functions(bus_functions)
