"""A client send refused because a destination's queue is full (``QueueFull``) writes nothing -
and takes no number in its session's stream: the next send takes the number the refused one
would have had, so a session that waits for every number (``skip_gaps=False``) never waits for
a message that was never sent."""

from __future__ import annotations

import pytest

from bus import Bus, Command, Context, Endpoint, Event, QueueFull, Settings
from bus.testing import InMemoryStorage, drain


class Tick(Command):
    board: str
    n: int


class Ticked(Event):
    board: str
    n: int


def build() -> tuple[Bus, list[int]]:
    seen: list[int] = []
    board = Endpoint("board", max_queue_depth=1)  # blocks at a gap (skip_gaps=False)
    roomy = Endpoint("roomy")

    @board.handles(Tick, partition=lambda m: m.board, session=lambda m: m.board)
    def tick(message: Tick, ctx: Context) -> None:
        seen.append(message.n)

    @board.handles(Ticked, partition=lambda m: m.board, session=lambda m: m.board)
    def ticked(message: Ticked, ctx: Context) -> None:
        seen.append(message.n)

    @roomy.handles(Ticked, partition=lambda m: m.board, session=lambda m: m.board)
    def noted(message: Ticked, ctx: Context) -> None:
        pass

    bus = Bus(InMemoryStorage(), [board, roomy], settings=Settings(depth_check_seconds=0))
    bus.provision()
    return bus, seen


def test_a_refused_send_takes_no_number() -> None:
    bus, seen = build()
    bus.send(Tick(board="b", n=1))
    with pytest.raises(QueueFull):
        bus.send(Tick(board="b", n=2))  # refused: the queue holds 1
    drain(bus)
    bus.send(Tick(board="b", n=3))
    assert drain(bus).total() == {"processed": 1}
    assert seen == [1, 3]


def test_a_publish_refused_at_one_subscriber_takes_no_number_at_the_others() -> None:
    """Each subscriber's copy is numbered in its own stream: one full queue refuses the whole
    publish, before any copy is numbered."""
    bus, seen = build()
    bus.publish(Ticked(board="b", n=1))
    with pytest.raises(QueueFull):
        bus.publish(Ticked(board="b", n=2))  # board is full; roomy has room
    drain(bus)
    bus.publish(Ticked(board="b", n=3))
    assert drain(bus).total() == {"processed": 2}  # board's and roomy's: neither waits
    assert seen == [1, 3]
