"""Drain a bus in a test: run every endpoint's worker until the queues are idle.

    from bus.testing import drain

    bus.send(PlaceOrder(order_id="o-1", ...))
    drained = drain(bus)                 # raises MessagesPoisoned if a handler kept failing
    assert drained["orders"] == {"processed": 1}
    assert drained.total() == {"processed": 4, "duplicate": 1}

Like dramatiq's ``StubBroker.join(fail_fast=True)``, a message that ends in a poison queue
while draining fails the test with what its handler raised (the poison entry's reason and
exception); tests that expect poisoning pass ``fail_fast=False``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bus.bus import Bus
from bus.hosting.worker import Worker
from bus.protocol.poison.poisoned import PoisonedMessage

MAX_ROUNDS = 100
"""Polls of every endpoint before ``drain`` gives up on ever being idle (a message that keeps
coming back, or a handler that keeps sending)."""


class MessagesPoisoned(AssertionError):
    """Messages ended in a poison queue while draining; ``letters`` has their entries."""

    def __init__(self, letters: Sequence[PoisonedMessage]) -> None:
        self.letters = list(letters)
        lines = [f"{len(self.letters)} message(s) poisoned while draining:"]
        for letter in self.letters:
            entry = letter.entry
            kind = entry.envelope.message_type if entry.envelope else "(no envelope)"
            lines.append(f"  {entry.endpoint}: {kind} - {entry.reason}")
            if entry.exception:
                lines.extend("    " + line for line in entry.exception.rstrip().splitlines())
        super().__init__("\n".join(lines))


@dataclass(frozen=True)
class Drained(Mapping[str, dict[str, int]]):
    """Outcomes per endpoint (``processed``, ``duplicate``, ``poisoned`` ... with counts)."""

    outcomes: dict[str, dict[str, int]]
    signals: int
    """Signals processed in all (each part of a bundle counts)."""

    def __getitem__(self, endpoint: str) -> dict[str, int]:
        return self.outcomes[endpoint]

    def __iter__(self) -> Iterator[str]:
        return iter(self.outcomes)

    def __len__(self) -> int:
        return len(self.outcomes)

    def total(self) -> dict[str, int]:
        """Outcomes summed over the endpoints."""
        summed: dict[str, int] = {}
        for outcomes in self.outcomes.values():
            for outcome, count in outcomes.items():
                summed[outcome] = summed.get(outcome, 0) + count
        return summed


def drain(bus: Bus, endpoints: Iterable[str] | None = None, *, fail_fast: bool = True,
          max_rounds: int = MAX_ROUNDS, **worker_options: Any) -> Drained:
    """Poll ``endpoints`` (all of the bus's by default) round after round until a whole round
    finds nothing. Workers retry at once (``retry_delay=0``) unless ``worker_options`` say
    otherwise; a message whose retry policy delays it is not waited for. Raises
    MessagesPoisoned when ``fail_fast`` and a message was poisoned meanwhile, RuntimeError
    when the queues are still busy after ``max_rounds`` rounds."""
    names = list(bus.topology.endpoints) if endpoints is None else list(endpoints)
    workers = {name: Worker(bus, name, **{"retry_delay": 0.0, **worker_options})
               for name in names}
    before = _poisoned(bus, names) if fail_fast else {}
    signals = 0
    for _ in range(max_rounds):
        found = sum(worker.poll_once() for worker in workers.values())
        if not found:
            break
        signals += found
    else:
        raise RuntimeError(f"drain: {', '.join(names)} still busy after {max_rounds} rounds")
    if fail_fast:
        new = [letter for name, letters in _poisoned(bus, names).items() for letter in letters
               if letter.id not in {old.id for old in before[name]}]
        if new:
            raise MessagesPoisoned(new)
    return Drained({name: dict(w.outcomes) for name, w in workers.items()}, signals)


def _poisoned(bus: Bus, endpoints: list[str]) -> dict[str, list[PoisonedMessage]]:
    return {name: bus.poisoned(name).entries() for name in endpoints}
