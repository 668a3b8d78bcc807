"""The topology file: every storage resource an app's bus needs, for the Bicep to deploy.

``infra/topology.json`` is generated from the app (``python -m bus topology export``) and read
by ``infra/*.bicep`` with ``loadJsonContent``, so endpoints and subscriptions are declared once,
in the code. It holds, for the deployment's prefix:

* per endpoint: its queue, poison queue and state table;
* per reader endpoint (hosted elsewhere: a Spark job): its queue and poison queue;
* the bus-wide tables (inbox tokens, send ledger, ...) and containers (payloads, topics);
* per topic: its subscribers and the exact blob (name and bytes) the bus reads for it;
* the command routes (information for operators; nothing is deployed from them).

Nothing is re-derived: the bus itself provisions a twin of the app in memory
(:meth:`bus.Bus.provision`), and the file lists what that created - per-endpoint names matched
with :class:`bus.naming.Names`, topic blobs written by :class:`bus.protocol.copies.topics.Topics`. A
resource ``provision`` gains later lands in the file (and so in Azure) without a change here.
The output is deterministic: sorted keys, names sorted, subscribers in the order the bus
subscribes them, a trailing newline.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bus.adapters.memory import InMemoryStorage
from bus.bus import Bus
from bus.errors import ConfigurationError
from bus.messages import Message
from bus.naming import Names
from bus.protocol.copies.topics import Topics
from bus.storage import Blob, Blobs, Storage

DEFAULT_PATH = Path("infra") / "topology.json"
COMMENT = ("Generated from the app by `python -m bus topology export`; infra/*.bicep deploy it. "
           "Do not edit: change the endpoints in the code and run the command again.")


@dataclass(frozen=True)
class EndpointResources:
    """The storage one endpoint owns."""

    name: str
    queue: str
    poison_queue: str
    state_table: str


@dataclass(frozen=True)
class ReaderResources:
    """The queues of a reader endpoint (``Bus(readers=...)``): no state table."""

    name: str
    queue: str
    poison_queue: str


@dataclass(frozen=True)
class TopicFile:
    """One topic's recipient list, as the blob the bus reads (``blob`` in the topic container,
    ``content`` its exact text)."""

    topic: str
    blob: str
    subscribers: tuple[str, ...]
    content: str


@dataclass(frozen=True)
class TopologyFile:
    """Everything ``infra/topology.json`` says."""

    app: str
    prefix: str
    endpoints: tuple[EndpointResources, ...]
    tables: tuple[str, ...]
    """Bus-wide tables (every table but the endpoints' state tables)."""
    containers: tuple[str, ...]
    payload_container: str
    topic_container: str
    topics: tuple[TopicFile, ...]
    routes: Mapping[str, str]
    readers: tuple[ReaderResources, ...] = ()

    @classmethod
    def from_bus(cls, bus: Bus, *, app: str, prefix: str | None = None) -> TopologyFile:
        """Describe ``bus``'s resources with ``prefix`` (default: the bus's own prefix).

        Raises ConfigurationError when two endpoints would share a resource under ``prefix``,
        or when the bus creates a queue this file has no place for.
        """
        names = bus.names if prefix is None else Names(prefix)
        topology = bus.topology
        topology.check_names(names)
        endpoints = tuple(
            EndpointResources(name=name, queue=names.queue(name),
                              poison_queue=names.poison_queue(name),
                              state_table=names.state_table(name))
            for name in sorted(topology.endpoints))
        readers = tuple(ReaderResources(name=name, queue=names.queue(name),
                                        poison_queue=names.poison_queue(name))
                        for name in sorted(topology.readers))
        queues, tables, containers = provisioned(bus, names.prefix)
        described = {q for e in endpoints for q in (e.queue, e.poison_queue)}
        described |= {q for r in readers for q in (r.queue, r.poison_queue)}
        if queues != described:
            raise ConfigurationError(
                f"Bus.provision() creates queues {sorted(queues - described)} that are not an "
                "endpoint's queue or poison queue: teach bus/operations/topology_file.py them")
        topics = tuple(topic_file(topic, topology.subscriptions[topic])
                       for topic in sorted(topology.subscriptions))
        return cls(app=app, prefix=names.prefix, endpoints=endpoints,
                   tables=tuple(sorted(tables - {e.state_table for e in endpoints})),
                   containers=tuple(sorted(containers)),
                   payload_container=names.payload_container,
                   topic_container=names.topic_container, topics=topics,
                   routes=dict(sorted(topology.routes.items())), readers=readers)

    def to_json(self) -> str:
        """The file's text: camelCase keys for Bicep, sorted, indented, newline-terminated."""
        document: dict[str, Any] = {
            "$comment": COMMENT,
            "app": self.app,
            "prefix": self.prefix,
            "endpoints": [{"name": e.name, "queue": e.queue, "poisonQueue": e.poison_queue,
                           "stateTable": e.state_table} for e in self.endpoints],
            "tables": list(self.tables),
            "containers": list(self.containers),
            "payloadContainer": self.payload_container,
            "topicContainer": self.topic_container,
            "topics": [{"topic": t.topic, "blob": t.blob, "subscribers": list(t.subscribers),
                        "content": t.content} for t in self.topics],
            "routes": dict(self.routes),
            "readers": [{"name": r.name, "queue": r.queue, "poisonQueue": r.poison_queue}
                        for r in self.readers],
        }
        return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def provisioned(bus: Bus, prefix: str) -> tuple[set[str], set[str], set[str]]:
    """The queues, tables and containers ``bus.provision()`` creates under ``prefix``.

    A twin of ``bus`` (same endpoints and routes) provisions in-memory storage; nothing is
    sent anywhere.
    """
    memory = InMemoryStorage()
    blobs = _ContainerLog(memory.blobs)
    routes: dict[type[Message] | str, str] = {k: v for k, v in bus.topology.routes.items()}
    for endpoint in bus.topology.endpoints.values():
        for contract in endpoint.commands():  # keyed by class too, as the app declared them
            routes[contract] = bus.topology.routes[contract.message_type]
    twin = Bus(Storage(memory.queues, blobs, memory.tables),
               list(bus.topology.endpoints.values()), prefix=prefix, routes=routes,
               readers=bus.topology.readers)
    twin.provision()
    return set(memory.queues.names()), set(memory.tables.names()), set(blobs.created)


class _ContainerLog:
    """Blobs that remember the containers created through them."""

    def __init__(self, blobs: Blobs) -> None:
        self._blobs = blobs
        self.created: list[str] = []

    def create_container(self, container: str) -> None:
        self._blobs.create_container(container)
        self.created.append(container)

    def read(self, container: str, name: str, *, max_bytes: int | None = None) -> Blob:
        return self._blobs.read(container, name, max_bytes=max_bytes)

    def write(self, container: str, name: str, data: bytes, *, etag: str | None = None,
              create_only: bool = False) -> str:
        return self._blobs.write(container, name, data, etag=etag, create_only=create_only)

    def delete(self, container: str, name: str) -> None:
        self._blobs.delete(container, name)

    def list(self, container: str, prefix: str = "") -> list[str]:
        return self._blobs.list(container, prefix)


def topic_file(topic: str, subscribers: Sequence[str]) -> TopicFile:
    """The blob the bus itself writes when ``subscribers`` subscribe to ``topic`` in order.

    It runs the bus's own :class:`Topics` against in-memory storage, so the name and the bytes
    are exactly what a running app writes (and reads) - no second copy of the format.
    """
    storage = InMemoryStorage()
    container = "topics"
    storage.blobs.create_container(container)
    topics = Topics(storage.blobs, container)
    for endpoint in subscribers:
        topics.subscribe(topic, endpoint)
    [blob] = storage.blobs.list(container)
    content = storage.blobs.read(container, blob).data.decode()
    return TopicFile(topic=topic, blob=blob, subscribers=tuple(subscribers), content=content)


def recorded_prefix(text: str) -> str | None:
    """The prefix a topology file was generated with (None when it records none)."""
    try:
        prefix = json.loads(text).get("prefix")
    except (ValueError, AttributeError):
        return None
    return prefix if isinstance(prefix, str) else None


@dataclass(frozen=True)
class Drift:
    """The committed file against one regenerated from the app now."""

    path: Path
    committed: str | None
    fresh: str

    @property
    def in_sync(self) -> bool:
        return self.committed == self.fresh

    def diff(self) -> str:
        """A unified diff from the committed file to the regenerated one."""
        before = (self.committed or "").splitlines(keepends=True)
        after = self.fresh.splitlines(keepends=True)
        return "".join(difflib.unified_diff(before, after, f"{self.path} (committed)",
                                            f"{self.path} (from the app)"))


def drift(bus: Bus, path: Path, *, app: str) -> Drift:
    """Compare ``path`` with the file the app generates now, with the prefix ``path`` records.

    The prefix is a deployment choice, not part of the app, so it is taken from the file; every
    other difference (endpoints, subscriptions, names, a hand edit) is drift.
    """
    committed = path.read_text(encoding="utf-8") if path.exists() else None
    prefix = recorded_prefix(committed) if committed is not None else None
    fresh = TopologyFile.from_bus(bus, app=app, prefix=prefix).to_json()
    return Drift(path=path, committed=committed, fresh=fresh)
