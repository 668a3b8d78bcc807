"""The Bus: the client API and the operator API over one set of parts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from bus.client import Client
from bus.endpoint import Endpoint
from bus.messages import Message
from bus.middleware import Middleware
from bus.naming import Names
from bus.observability import Telemetry
from bus.operator import Operator, Pause
from bus.parts import Parts
from bus.seams import Seams
from bus.serialization import Serializer
from bus.settings import Settings
from bus.storage import Storage
from bus.topology import Readers, Topology

__all__ = ["Bus", "Pause"]


class Bus(Client, Operator):
    """Send, publish, receive and maintain, against one storage account.

    ``middleware`` runs around every handler and every send, outside each endpoint's own
    (``bus.middleware``). ``max_queue_depths`` bounds the queues of endpoints this app sends to
    but does not define (an endpoint's own ``max_queue_depth`` wins). ``readers``: endpoints
    hosted elsewhere (Spark jobs) and the topics each subscribes to (``bus.topology``).
    ``telemetry``: where spans and metrics go (``bus.observability``; by default the global
    OpenTelemetry providers, no-ops unless an SDK is installed).

    A bus is the client API (``bus.client.Client``: send, publish, ...) and the operator API
    (``bus.operator.Operator``: provision, pause, poisoned messages, sessions, ...) over one
    ``bus.parts.Parts``, built once; hosts and tools take the pieces they need from ``parts``
    (receivers, admission, the inbox, ...). Tests and the simulation that move time build the
    parts with other seams (clock, ids, sleeps, safeguards) and a bus over them:
    ``bus.testing.seamed_bus`` or ``Bus.over(Parts(..., seams=...))``.
    """

    def __init__(self, storage: Storage, endpoints: Sequence[Endpoint] = (), *,
                 prefix: str = "", routes: Mapping[type[Message] | str, str] | None = None,
                 settings: Settings | None = None, serializer: Serializer | None = None,
                 middleware: Sequence[Middleware] = (),
                 max_queue_depths: Mapping[str, int] | None = None,
                 readers: Readers | None = None, telemetry: Telemetry | None = None) -> None:
        super().__init__(Parts(storage, endpoints, prefix=prefix, routes=routes,
                               settings=settings, serializer=serializer, middleware=middleware,
                               max_queue_depths=max_queue_depths, readers=readers,
                               telemetry=telemetry, seams=Seams()))

    @classmethod
    def over(cls, parts: Parts) -> Bus:
        """A bus over parts built already (with seams of a test's own, say)."""
        bus = cls.__new__(cls)
        Client.__init__(bus, parts)
        return bus

    # What the bus was built with, for operators' scripts (docs/operating.md).
    @property
    def storage(self) -> Storage:
        """The storage as given."""
        return self.parts.storage

    @property
    def names(self) -> Names:
        """The names of its queues, tables and containers (``Names(prefix)``)."""
        return self.parts.names

    @property
    def topology(self) -> Topology:
        """Its endpoints, routes and readers."""
        return self.parts.topology

    @property
    def settings(self) -> Settings:
        return self.parts.settings
