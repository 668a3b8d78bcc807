"""A copy can arrive before its sender confirms its token: the sender signals first, then
makes the token live. A receiver that poisons such a copy (its handler rejects it, it expired,
it cannot be processed) confirms the token itself before it writes the entry - else the
sender's confirmation, landing between the receiver's read and its poisoning, changes the
token's ETag, the poisoning fails, and the token stays live with its entry written and its
signal gone: the sweeper later takes it for an orphan and writes a second entry."""

from __future__ import annotations

import pytest

from bus import Bus, Command, Context, Endpoint, Reject
from bus.hosting.worker import Worker
from bus.protocol.poison.queue import PoisonQueue
from bus.protocol.tokens.inbox import Inbox, TokenState
from bus.storage import TransientError
from bus.testing import InMemoryStorage


class Ask(Command):
    ref: str


class Refuse(Command):
    ref: str


def test_a_copy_poisoned_while_its_sender_confirms_its_token_has_its_token_poisoned(
        monkeypatch: pytest.MonkeyPatch) -> None:
    desk, bell = Endpoint("desk"), Endpoint("bell")

    @desk.handles(Ask, partition=lambda m: m.ref)
    def ask(message: Ask, ctx: Context) -> None:
        ctx.send(Refuse(ref=message.ref))

    @bell.handles(Refuse, partition=lambda m: m.ref)
    def refuse(message: Refuse, ctx: Context) -> None:
        raise Reject("not today")

    bus = Bus(InMemoryStorage(), [desk, bell])
    bus.provision()
    bus.send(Ask(ref="a1"))

    # The desk commits and signals the Refuse; its request confirming the token times out
    # (and so does every later try), to land only later: a ghost.
    real_confirm = Inbox.confirm_many
    ghosts: list[tuple[Inbox, tuple[object, ...], dict[str, object]]] = []

    def timed_out(self: Inbox, *args: object, **kwargs: object) -> None:
        ghosts.append((self, args, kwargs))
        raise TransientError("the request confirming the desk's tokens timed out")

    monkeypatch.setattr(Inbox, "confirm_many", timed_out)
    Worker(bus, "desk", retry_delay=60, in_process_tries=1).poll_once()  # back in a minute
    [token] = bus.parts.inbox.all("bell")
    assert token.state is TokenState.PENDING  # signalled, not confirmed

    # The bell rejects the copy; as its entry is written, the first confirmation lands.
    real_put = PoisonQueue.put

    def confirmed_meanwhile(self: PoisonQueue, *args: object, **kwargs: object) -> object:
        inbox, confirm_args, confirm_kwargs = ghosts[0]
        real_confirm(inbox, *confirm_args, **confirm_kwargs)  # type: ignore[arg-type]
        return real_put(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(PoisonQueue, "put", confirmed_meanwhile)
    Worker(bus, "bell", retry_delay=0).poll_once()

    [token] = bus.parts.inbox.all("bell")
    assert token.state is TokenState.POISONED and not token.orphan
    [entry] = bus.poisoned("bell").entries()
    assert entry.entry.reason.startswith("rejected")
