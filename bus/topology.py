"""The topology: endpoints, where each command goes, and who subscribes to each topic.

It is derived from the handlers (as the SafeBunny library derives its topology from node and
type): an endpoint that handles a command owns it; an endpoint that handles an event subscribes
to its topic.
Commands owned by endpoints outside this app are declared with ``routes``; endpoints outside
it that subscribe to topics - Spark jobs reading their queue, *reader endpoints* - with
``readers``, so that the deployment writes their subscriptions too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from bus.endpoint import Endpoint, check_depth
from bus.errors import ConfigurationError, NamingError
from bus.messages import Event, Message, topic_of
from bus.naming import Names, check_endpoint

Readers = Mapping[str, Sequence[type[Event] | str]]
"""Reader endpoints (hosted elsewhere, as Spark jobs) and the topics - event classes or topic
names - each subscribes to."""


class Topology:
    def __init__(self, endpoints: Sequence[Endpoint] = (),
                 routes: Mapping[type[Message] | str, str] | None = None,
                 readers: Readers | None = None) -> None:
        self.endpoints: dict[str, Endpoint] = {}
        for endpoint in endpoints:
            if endpoint.name in self.endpoints:
                raise ConfigurationError(f"two endpoints are named {endpoint.name!r}")
            self.endpoints[endpoint.name] = endpoint
        self.routes = self._command_routes(routes or {})
        self.readers = self._readers(readers or {})
        """Reader endpoint -> the topics it subscribes to (not hosted by this app)."""
        self.subscriptions = self._subscriptions()

    def endpoint(self, name: str) -> Endpoint:
        try:
            return self.endpoints[name]
        except KeyError:
            known = ", ".join(sorted(self.endpoints)) or "none"
            raise ConfigurationError(
                f"unknown endpoint {name!r}: this app defines {known}") from None

    @property
    def destinations(self) -> set[str]:
        """Every endpoint a command may be sent to from here."""
        return set(self.endpoints) | set(self.routes.values())

    def depth_limits(self, declared: Mapping[str, int]) -> dict[str, int]:
        """Maximum queue depth per endpoint: ``declared`` (for endpoints defined elsewhere),
        then each endpoint's own ``max_queue_depth``."""
        limits = {check_endpoint(name): check_depth(name, depth)
                  for name, depth in declared.items()}
        limits.update({name: e.max_queue_depth for name, e in self.endpoints.items()
                       if e.max_queue_depth is not None})
        return {name: depth for name, depth in limits.items() if depth is not None}

    def check_names(self, names: Names) -> None:
        """Fail at start-up when two endpoints would share a queue or a state table."""
        for kind, derive in (("queue", names.queue), ("state table", names.state_table)):
            seen: dict[str, str] = {}
            for name in sorted({*self.endpoints, *self.readers}):
                try:
                    resource = derive(name)
                except NamingError as exc:
                    raise ConfigurationError(str(exc)) from exc
                if resource in seen:
                    raise ConfigurationError(
                        f"endpoints {seen[resource]!r} and {name!r} would share the {kind} "
                        f"{resource!r}: rename one of them")
                seen[resource] = name

    def _command_routes(self, declared: Mapping[type[Message] | str, str]) -> dict[str, str]:
        routes: dict[str, str] = {}
        for endpoint in self.endpoints.values():
            for contract in endpoint.commands():
                owner = routes.setdefault(contract.message_type, endpoint.name)
                if owner != endpoint.name and contract not in declared:
                    raise ConfigurationError(
                        f"command {contract.message_type} is handled by both {owner!r} and "
                        f"{endpoint.name!r}; a command has one owner (route it explicitly)")
        for key, destination in declared.items():
            message_type = key if isinstance(key, str) else key.message_type
            routes[message_type] = check_endpoint(destination)
        return routes

    def _readers(self, declared: Readers) -> dict[str, tuple[str, ...]]:
        readers: dict[str, tuple[str, ...]] = {}
        for name, topics in declared.items():
            check_endpoint(name)
            if name in self.endpoints:
                raise ConfigurationError(f"{name!r} is an endpoint of this app: a reader "
                                         "endpoint is one hosted elsewhere (a Spark job)")
            if isinstance(topics, str):
                raise ConfigurationError(f"reader {name!r}: give a list of topics, not the "
                                         f"string {topics!r}")
            readers[name] = tuple(dict.fromkeys(
                topic for declared in topics for topic in _topics(name, declared)))
        return readers

    def _subscriptions(self) -> dict[str, list[str]]:
        subscriptions: dict[str, list[str]] = {}
        for endpoint in self.endpoints.values():
            for contract in endpoint.events():
                # An alias's topic too: producers on the contract's earlier name publish there.
                for topic in (topic_of(contract), *contract.aliases):  # type: ignore[arg-type]
                    subscriptions.setdefault(topic, []).append(endpoint.name)
        for name, topics in self.readers.items():
            for topic in topics:
                subscriptions.setdefault(topic, []).append(name)
        return subscriptions


def _topics(reader: str, topic: type[Event] | str) -> tuple[str, ...]:
    """A topic named, or an event class's topic and its aliases' (``Message.aliases``)."""
    if isinstance(topic, str):
        return (topic,)
    if isinstance(topic, type) and issubclass(topic, Event):
        return (topic_of(topic), *topic.aliases)
    raise ConfigurationError(f"reader {reader!r}: {topic!r} is neither an event class nor a "
                             "topic name")
