"""A Bus with the simulation's seams: its clock, ids, sleeps, random draws and safeguards."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from bus.bus import Bus
from bus.endpoint import Endpoint
from bus.messages import Message
from bus.middleware import Middleware
from bus.observability import Telemetry
from bus.parts import Parts
from bus.seams import Seams
from bus.serialization import Serializer
from bus.settings import Settings
from bus.storage import Storage
from bus.topology import Readers


def seamed_bus(seams: Seams, storage: Storage, endpoints: Sequence[Endpoint] = (), *,
               prefix: str = "", routes: Mapping[type[Message] | str, str] | None = None,
               settings: Settings | None = None, serializer: Serializer | None = None,
               middleware: Sequence[Middleware] = (),
               max_queue_depths: Mapping[str, int] | None = None,
               readers: Readers | None = None, telemetry: Telemetry | None = None) -> Bus:
    """``Bus(storage, endpoints, ...)`` whose clock, ids, sleeps and safeguards are ``seams``'s
    (for tests and the simulation: production never replaces them)."""
    return Bus.over(Parts(storage, endpoints, prefix=prefix, routes=routes, settings=settings,
                          serializer=serializer, middleware=middleware,
                          max_queue_depths=max_queue_depths, readers=readers,
                          telemetry=telemetry, seams=seams))
