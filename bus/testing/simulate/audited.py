"""The audit trail in the simulation: every operator action that completed has its record.

``completions()`` counts, while a run lasts, each operator action (``bus.audit.ACTIONS``) that
returned normally - whoever took it: the console, the operator replaying what storage errors
poisoned, the releaser, the session watcher - and ``check`` compares the counts with the
records in the audit table once the run is over (read outside the faults). A record may be
there for an action that then failed (it is written first), never missing for one that ran.
"""

from __future__ import annotations

import contextlib
import functools
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from bus.adapters.memory import InMemoryStorage
from bus.bus import Bus
from bus.operator import Operator
from bus.protocol.outbox.deferral import Deferrals
from bus.protocol.poison.poisoned import PoisonedMessages
from bus.protocol.sessions.admin import Sessions

ACTED: tuple[tuple[type, str, str], ...] = (
    (Operator, "pause", "pause"), (Operator, "resume", "resume"),
    (PoisonedMessages, "replay", "replay"), (PoisonedMessages, "purge", "purge"),
    (Deferrals, "release", "release"), (Sessions, "skip", "skip"), (Sessions, "close", "close"))
"""Each operator action's method, and the action its record names."""


@contextlib.contextmanager
def completions() -> Iterator[Counter[str]]:
    """Count the operator actions that return normally inside the block, by action."""
    done: Counter[str] = Counter()
    originals = [(owner, name, owner.__dict__[name]) for owner, name, _ in ACTED]

    def counted(action: str, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def call(*args: Any, **kwargs: Any) -> Any:
            result = method(*args, **kwargs)
            done[action] += 1
            return result
        return call

    for owner, name, action in ACTED:
        setattr(owner, name, counted(action, owner.__dict__[name]))
    try:
        yield done
    finally:
        for owner, name, method in originals:
            setattr(owner, name, method)


def recorded(bus: Bus, storage: InMemoryStorage) -> Counter[str]:
    """The audit table's records by action (read outside the faults)."""
    return Counter(str(row.properties.get("action"))
                   for row in storage.tables.rows(bus.names.audit_table))


def check(bus: Bus, storage: InMemoryStorage, done: Counter[str]) -> list[str]:
    """Every completed action has its record."""
    found = recorded(bus, storage)
    return [f"{count} {action} action(s) completed, {found[action]} audit record(s) of them"
            for action, count in sorted(done.items()) if found[action] < count]

