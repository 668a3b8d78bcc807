"""Concurrent invocations of one endpoint share a claim round.

The Functions host gives each queue message an invocation of its own and runs many at once
(host.json ``batchSize``, ``newBatchThreshold``). Alone, each invocation would be a round of
one: its token read, its outgoing tokens' creation, its signal's send and its token's
consumption each a request of its own. Instead the invocations of one endpoint in one worker
process share rounds (``bus.groups``): while one round runs, the invocations that arrive wait;
the first of them then settles everything waiting in one ``Settlement.settle`` - one token read
per token shard, one transaction per destination for the outgoing tokens, one bundle per
destination for the signals, one consuming request per token partition. A lone invocation
never waits; a waiting one waits for at most the round ahead of it.

Sharing a round changes who makes the requests, not what they are: the receiver processes a
batch of signals exactly as the polling worker's batches (docs/protocol.md, "Concurrency
inside a round"). Each invocation still returns (the host deletes its message) or raises (the
host releases it) for its own message only, from what the round settled for it; one whose
round never settled it (the leading thread died half-way) raises, and its message is
delivered again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from bus.groups import Gate, GroupCommit
from bus.hosting.settlement import Settled, Settlement
from bus.protocol.copies.bundles import Leased

M = TypeVar("M", bound=Leased)

MAX_ROUND = 32
"""Invocations per shared round at most (more wait for the next): the polling worker's batch."""


class RoundLost(Exception):
    """The round that took this invocation's message ended before settling it."""


@dataclass(eq=False)
class _Member(Generic[M]):
    message: M
    settled: list[Settled[M]] | None = None
    error: Exception | None = None


@dataclass(eq=False)
class SharedRounds(Generic[M]):
    """Settles each invocation's message in a round shared with the concurrent ones."""

    settlement: Settlement[M]
    gate: Callable[[], Gate] = threading.Event
    _group: GroupCommit[_Member[M]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._group = GroupCommit(self._round, self.gate, limit=MAX_ROUND)

    @property
    def rounds(self) -> int:
        """Rounds run (statistics)."""
        return self._group.flushes

    @property
    def shared(self) -> int:
        """Invocations whose message shared a round with others' (statistics)."""
        return self._group.grouped

    @property
    def waiting(self) -> int:
        """Invocations waiting for a round."""
        return self._group.waiting

    @property
    def busy(self) -> bool:
        """Whether a round runs."""
        return self._group.busy

    def settle(self, message: M) -> list[Settled[M]]:
        """What became of ``message``'s signals (``Settlement.settle``), settled in a round
        with whatever else is waiting; raises what the round raised, or ``RoundLost``."""
        member: _Member[M] = _Member(message)
        self._group.submit(member)
        if member.error is not None:
            raise member.error
        if member.settled is None:
            raise RoundLost("the round that took this message ended before settling it; "
                            "it will be delivered again")
        return member.settled

    def _round(self, members: list[_Member[M]]) -> None:
        try:
            settled = self.settlement.settle([member.message for member in members])
        except Exception as exc:  # not a failure the protocol knows: every member raises it
            for member in members:
                member.error = exc
            return
        for member in members:
            member.settled = [s for s in settled if s.part.message is member.message]
