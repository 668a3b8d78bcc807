"""The partition-budget model: a workload's storage requests replayed against Azure's published
scalability targets, to show what one endpoint can reach on Azure whatever the compute.

Azure Storage serves each table partition, each queue and each account from a budget of its
own (docs/performance.md cites the targets; "Scalability and performance targets for Table
storage / Queue Storage / standard storage accounts"):

* a table partition: about 2,000 entities per second - an entity-group transaction counts each
  of its entities, a query each entity it returns;
* a queue: about 2,000 messages per second (1 KiB messages) - a send, a delete or a lease
  renewal counts one message, a receive the messages it returned;
* an account: 20,000 requests per second (the current page lists 40,000 for general-purpose
  v2 accounts in large regions; the model keeps the lower, documented figure).

:class:`LoadBook` wraps a bus's storage and records, per request, which of those budgets it
draws on and how much; :func:`ceiling` divides each budget by what one message draws from it
and reports the smallest quotient - the throughput at which the busiest partition or queue
reaches its target (beyond it Azure answers 503 Server Busy). The benchmark records the
exactly-once hop (the client's sends and the endpoint's work) and reports the endpoint's
ceiling as ``endpoint_ceiling_msgs_per_s_azure``.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bus.protocol.tokens.shards import endpoint_of, shard_partition
from bus.storage import Storage
from bus.storage.ports import Entity, QueueMessage, TableOp
from bus.testing.transport import ForwardingQueues

PARTITION_ENTITIES_PER_S = 2_000.0
QUEUE_MESSAGES_PER_S = 2_000.0
ACCOUNT_REQUESTS_PER_S = 20_000.0

Budget = tuple[str, ...]
"""("table", table, partition), ("queue", queue) or ("account",)."""

ACCOUNT: Budget = ("account",)


class LoadBook:
    """Thread-safe draws on each budget (entities, messages, requests)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._draws: dict[Budget, int] = {}

    def draw(self, budget: Budget, units: int) -> None:
        with self._lock:
            self._draws[budget] = self._draws.get(budget, 0) + units
            self._draws[ACCOUNT] = self._draws.get(ACCOUNT, 0) + 1

    def reset(self) -> None:
        with self._lock:
            self._draws.clear()

    def snapshot(self) -> dict[Budget, int]:
        with self._lock:
            return dict(self._draws)


class _Queues(ForwardingQueues):
    def __init__(self, inner: Any, book: LoadBook) -> None:
        super().__init__(inner)
        self._book = book

    def send(self, queue: str, body: str, *, delay: float = 0.0) -> None:
        self._book.draw(("queue", queue), 1)
        self._inner.send(queue, body, delay=delay)

    def receive(self, queue: str, *, max_messages: int, lease: float) -> list[QueueMessage]:
        found: list[QueueMessage] = self._inner.receive(queue, max_messages=max_messages,
                                                        lease=lease)
        self._book.draw(("queue", queue), len(found))
        return found

    def delete(self, queue: str, message: QueueMessage) -> None:
        self._book.draw(("queue", queue), 1)
        self._inner.delete(queue, message)

    def extend(self, queue: str, message: QueueMessage, *, lease: float) -> QueueMessage:
        self._book.draw(("queue", queue), 1)
        renewed: QueueMessage = self._inner.extend(queue, message, lease=lease)
        return renewed


class _Tables:
    """The table port, each call drawn on its partition's budget (entities)."""

    def __init__(self, inner: Any, book: LoadBook) -> None:
        self._inner = inner
        self._book = book
        self.limits = inner.limits

    def __getattr__(self, name: str) -> Any:  # create_table and the rest: account only
        return getattr(self._inner, name)

    def _draw(self, table: str, partition: str, entities: int) -> None:
        self._book.draw(("table", table, partition), max(1, entities))

    def get(self, table: str, partition_key: str, row_key: str) -> Entity:
        self._draw(table, partition_key, 1)
        entity: Entity = self._inner.get(table, partition_key, row_key)
        return entity

    def get_many(self, table: str, partition_key: str,
                 row_keys: Sequence[str]) -> dict[str, Entity]:
        self._draw(table, partition_key, len(row_keys))
        found: dict[str, Entity] = self._inner.get_many(table, partition_key, row_keys)
        return found

    def insert(self, table: str, entity: Entity) -> str:
        self._draw(table, entity.partition_key, 1)
        etag: str = self._inner.insert(table, entity)
        return etag

    def replace(self, table: str, entity: Entity, *, etag: str | None = None) -> str:
        self._draw(table, entity.partition_key, 1)
        new: str = self._inner.replace(table, entity, etag=etag)
        return new

    def delete(self, table: str, partition_key: str, row_key: str, *,
               etag: str | None = None) -> None:
        self._draw(table, partition_key, 1)
        self._inner.delete(table, partition_key, row_key, etag=etag)

    def transact(self, table: str, ops: Sequence[TableOp]) -> list[str]:
        if ops:
            self._draw(table, ops[0].entity.partition_key, len(ops))
        etags: list[str] = self._inner.transact(table, ops)
        return etags

    def query(self, table: str, partition_key: str | None = None,
              row_key: str | None = None, *, row_key_prefix: str | None = None,
              row_key_after: str | None = None, row_key_before: str | None = None,
              limit: int | None = None,
              ) -> list[Entity]:
        found: list[Entity] = self._inner.query(table, partition_key, row_key,
                                                row_key_prefix=row_key_prefix,
                                                row_key_after=row_key_after,
                                                row_key_before=row_key_before, limit=limit)
        self._draw(table, partition_key or "*", len(found))
        return found


def recording(storage: Storage, book: LoadBook) -> Storage:
    """``storage`` with its queue and table requests drawn on ``book``'s budgets (blobs: the
    account's only - a payload blob has a budget of its own, far above these)."""
    return Storage(queues=_Queues(storage.queues, book), blobs=storage.blobs,
                   tables=_Tables(storage.tables, book))


def target(budget: Budget) -> float:
    return {"table": PARTITION_ENTITIES_PER_S, "queue": QUEUE_MESSAGES_PER_S}.get(
        budget[0], ACCOUNT_REQUESTS_PER_S)


@dataclass(frozen=True)
class Ceiling:
    msgs_per_s: float
    """Messages per second at which the first budget reaches its target."""
    budget: Budget
    """That budget."""
    per_message: float
    """What one message draws from it (entities, messages or requests)."""
    account_msgs_per_s: float
    """The whole account's ceiling at this workload (every endpoint together)."""


def ceiling(draws: Mapping[Budget, int], messages: int,
            mine: Sequence[Budget] | None = None) -> Ceiling:
    """The ceiling of a workload that moved ``messages`` with ``draws``: over the budgets in
    ``mine`` (all but the account's when None), the smallest ``target / draw per message``."""
    per = {budget: n / messages for budget, n in draws.items() if n}
    chosen = [b for b in per if b != ACCOUNT and (mine is None or b in mine)]
    if not chosen:
        raise ValueError("the workload drew on none of the budgets asked about")
    worst = min(chosen, key=lambda b: target(b) / per[b])
    account = ACCOUNT_REQUESTS_PER_S / per[ACCOUNT] if ACCOUNT in per else float("inf")
    return Ceiling(target(worst) / per[worst], worst, per[worst], account)


@dataclass(frozen=True)
class EndpointBudgets:
    """The budgets of one endpoint: its queue, its partitions of the tokens table (one per
    token shard, ``bus.protocol.tokens.shards``), and every partition of its state table."""

    queue: str
    tokens_table: str
    endpoint: str
    state_table: str

    def owns(self, budget: Budget) -> bool:
        if budget[0] == "queue":
            return budget[1] == self.queue
        if budget[0] == "table":
            return budget[1] == self.state_table or (
                budget[1] == self.tokens_table and endpoint_of(budget[2]) == self.endpoint)
        return False

    def as_mine(self, budget: Budget, other: EndpointBudgets) -> Budget:
        """``other``'s queue or token partition budget named as this endpoint's (the same
        shard)."""
        if budget[0] == "queue":
            return ("queue", self.queue)
        if budget[1] == other.tokens_table:
            return ("table", self.tokens_table,
                    shard_partition(self.endpoint, shard_of_partition(budget[2])))
        return ("table", self.state_table, *budget[2:])


def in_chain(draws: Mapping[Budget, int], this: EndpointBudgets,
             following: EndpointBudgets) -> dict[Budget, int]:
    """The draws of an endpoint in the middle of a chain of endpoints like it, from a run in
    which ``this`` sent to ``following``: what it drew on its own budgets, plus what it drew
    on the next one's (its queue, its token partition) - which is what its own upstream,
    a handler like it, draws on it. The account's draw is every request of the run."""
    chained: dict[Budget, int] = {b: n for b, n in draws.items() if this.owns(b)}
    for budget, n in draws.items():
        if following.owns(budget):
            mine = this.as_mine(budget, following)
            chained[mine] = chained.get(mine, 0) + n
    chained[ACCOUNT] = draws.get(ACCOUNT, 0)
    return chained


def shard_of_partition(partition_key: str) -> int:
    """The token shard a token partition is (0: the endpoint's own name)."""
    endpoint = endpoint_of(partition_key)
    return int(partition_key[len(endpoint) + 1:]) if partition_key != endpoint else 0


def describe(found: Ceiling) -> str:
    what = {"table": "entities of table partition", "queue": "messages of queue"}.get(
        found.budget[0], "requests of the account")
    where = "/".join(found.budget[1:])
    return (f"{found.msgs_per_s:,.0f} msgs/s: the {what} {where} ({found.per_message:.2f} "
            f"per message, target {target(found.budget):,.0f}/s); the account's "
            f"{ACCOUNT_REQUESTS_PER_S:,.0f} requests/s at {found.account_msgs_per_s:,.0f} "
            f"msgs/s")
