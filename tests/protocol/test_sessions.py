"""Sessions (bus.protocol.sessions.order): each sender stream's messages handled in order, once,
under shuffled, duplicated and delayed delivery; gaps blocking, skipped; session state and
close; the operators' tools - on the in-memory backend and on Azurite."""

from __future__ import annotations

import json
import random
import sys
import time
from datetime import datetime, timezone

import pytest
from click.testing import CliRunner

from bus import Bus, Command, Context, Endpoint, Settings, StateError
from bus.envelope import Envelope
from bus.hosting.maintenance import maintenance_pass
from bus.operations.cli import main
from bus.protocol.poison.poisoned import ReplayResult
from bus.protocol.safeguards import Safeguards
from bus.protocol.sessions.order import Gaps, SessionRow, SetAside, Waiting, plan
from bus.retry import Reject
from bus.seams import Seams
from bus.signing import Signing, SigningKey
from bus.storage import Storage
from bus.testing import InMemoryStorage, drain
from bus.testing.counting import counting_storage
from bus.testing.seamed import seamed_bus


class Step(Command):
    order: str
    n: int
    last: bool = False


class Start(Command):
    order: str
    first: int
    count: int


class Clock:
    def __init__(self) -> None:
        self.now = 1_900_000_000.0

    def __call__(self) -> float:
        return self.now


class Shop:
    """Endpoint ``s`` handles Step in sessions by order; ``a`` sends Steps from a handler."""

    def __init__(self, storage: Storage, prefix: str, *, skip_gaps: bool = False,
                 refuse: set[int] | None = None, safeguards: Safeguards | None = None) -> None:
        self.clock = Clock()
        self.handled: list[tuple[str, int, int | None]] = []
        self.refuse = refuse if refuse is not None else set()
        s = Endpoint("s", reorder_window=60.0, skip_gaps=skip_gaps)
        a = Endpoint("a")

        @s.handles(Step, partition=lambda m: m.order, session=lambda m: m.order)
        def step(message: Step, ctx: Context) -> None:
            assert ctx.session is not None
            if message.n in self.refuse:
                raise Reject(f"step {message.n} refused")
            state = ctx.session.state
            state["seen"] = [*state.get("seen", []), message.n]
            row = ctx.state.get("total") or {"n": 0}
            ctx.state.put("total", {"n": int(row["n"] or 0) + 1})
            self.handled.append((message.order, message.n, ctx.session.sequence))
            if message.last:
                ctx.session.close()

        @a.handles(Start, partition=lambda m: m.order)
        def start(message: Start, ctx: Context) -> None:
            for n in range(message.first, message.first + message.count):
                ctx.send(Step(order=message.order, n=n))

        self.bus = seamed_bus(Seams(clock=self.clock, safeguards=safeguards or Safeguards()),
                              storage, [s, a], prefix=prefix,
                              settings=Settings(signal_bundles=False))
        self.bus.provision()

    def shuffle(self, seed: int, duplicates: int = 0) -> int:
        """Take every signal off ``s``'s queue and put them back in a random order, some
        twice; returns how many there were."""
        queues, queue = self.bus.storage.queues, self.bus.names.queue("s")
        bodies: list[str] = []
        while batch := queues.receive(queue, max_messages=32, lease=60):
            for message in batch:
                bodies.append(message.body)
                queues.delete(queue, message)
        rng = random.Random(seed)
        rng.shuffle(bodies)
        for body in bodies + bodies[:duplicates]:
            queues.send(queue, body)
        return len(bodies)

    def session(self, order: str) -> dict[str, object]:
        info = self.bus.sessions("s").get(order)
        assert info is not None
        return info.summary(self.clock(), 60.0)

    def steps(self, order: str) -> list[int]:
        return [n for o, n, _ in self.handled if o == order]


def test_a_clients_messages_are_handled_in_order_under_shuffled_duplicated_delivery(
        storage: Storage, prefix: str) -> None:
    shop = Shop(storage, prefix)
    for n in range(12):
        shop.bus.send(Step(order="o1", n=n))
        shop.bus.send(Step(order="o2", n=100 + n))
    assert shop.shuffle(seed=7, duplicates=6) == 24
    drain(shop.bus)
    assert shop.steps("o1") == list(range(12))
    assert shop.steps("o2") == [100 + n for n in range(12)]
    assert [seq for o, _, seq in shop.handled if o == "o1"] == list(range(1, 13))
    summary = shop.session("o1")
    assert summary["status"] == "open" and summary["waiting"] == 0
    assert summary["next"] == {"client:client": 13} and summary["handled"] == 12


def test_a_handlers_sends_are_numbered_across_its_commits(storage: Storage,
                                                          prefix: str) -> None:
    shop = Shop(storage, prefix)
    shop.bus.send(Start(order="o1", first=0, count=5))
    drain(shop.bus, ["a"])
    shop.bus.send(Start(order="o1", first=5, count=4))
    drain(shop.bus, ["a"])
    shop.shuffle(seed=3, duplicates=2)
    drain(shop.bus)
    assert shop.steps("o1") == list(range(9))
    assert shop.session("o1")["next"] == {"a/o1": 10}


def test_a_delayed_message_holds_back_the_ones_after_it(storage: Storage,
                                                        prefix: str) -> None:
    shop = Shop(storage, prefix)
    shop.bus.send(Step(order="o1", n=0), delay=1.0)
    for n in range(1, 4):
        shop.bus.send(Step(order="o1", n=n))
    drain(shop.bus)
    assert shop.steps("o1") == []
    assert shop.session("o1")["waiting"] == 3
    time.sleep(1.2)  # the queue's visibility delay runs on real time, the bus on its clock
    shop.clock.now += 2
    drain(shop.bus)
    assert shop.steps("o1") == [0, 1, 2, 3]


def test_a_session_s_summary_defaults_to_now_and_its_endpoint_s_window(
        storage: Storage, prefix: str) -> None:
    shop = Shop(storage, prefix)  # reorder_window=60
    shop.bus.send(Step(order="o1", n=0), delay=30.0)
    shop.bus.send(Step(order="o1", n=1))
    drain(shop.bus)
    info = shop.bus.sessions("s").get("o1")
    assert info is not None and info.reorder_window == 60.0
    assert info.summary()["status"] == "waiting"  # this machine's clock, the 60 s window
    assert info.summary(shop.clock() + 10, None)["status"] == "waiting"
    assert info.summary(shop.clock() + 61)["status"] == "stuck"


def test_a_gap_blocks_the_session_until_the_missing_message_is_replayed(
        storage: Storage, prefix: str) -> None:
    shop = Shop(storage, prefix, refuse={1})
    for n in range(4):
        shop.bus.send(Step(order="o1", n=n))
    drain(shop.bus, fail_fast=False)
    assert shop.steps("o1") == [0]  # 1 poisoned; 2 and 3 wait for it
    shop.clock.now += 120  # past the reorder window: blocked, reported, nothing skipped
    maintenance_pass(shop.bus)
    drain(shop.bus, fail_fast=False)
    assert shop.steps("o1") == [0]
    summary = shop.session("o1")
    assert summary["status"] == "stuck" and summary["first_waiting"] == {"client:client": 3}
    [listed] = shop.bus.sessions("s").list()
    assert listed.session == "o1"
    shop.refuse.clear()
    [letter] = shop.bus.poisoned("s").entries()
    assert shop.bus.poisoned("s").replay({letter.id}) == {letter.id: ReplayResult.REPLAYED}
    drain(shop.bus)
    assert shop.steps("o1") == [0, 1, 2, 3]
    assert shop.session("o1")["status"] == "open"


def test_with_skipping_a_gap_older_than_the_window_is_skipped_and_reported(
        storage: Storage, prefix: str) -> None:
    shop = Shop(storage, prefix, skip_gaps=True, refuse={1})
    for n in range(4):
        shop.bus.send(Step(order="o1", n=n))
    drain(shop.bus, fail_fast=False)
    assert shop.steps("o1") == [0]
    shop.clock.now += 30  # inside the window: nothing moves
    assert maintenance_pass(shop.bus).sessions_released == {"s": 0}
    shop.clock.now += 31
    assert maintenance_pass(shop.bus).sessions_released == {"s": 1}
    drain(shop.bus, fail_fast=False)
    assert shop.steps("o1") == [0, 2, 3]
    info = shop.bus.sessions("s").get("o1")
    assert info is not None
    [gap] = info.row.gaps
    assert (gap.first, gap.last, gap.by) == (2, 2, "window")
    # The skipped message is accounted for in the poison queue; replayed after the
    # skip, it is poisoned again with the reason instead of being handled out of order.
    shop.refuse.clear()
    [letter] = shop.bus.poisoned("s").entries()
    assert "step 1 refused" in letter.entry.reason
    shop.bus.poisoned("s").replay({letter.id})
    drain(shop.bus, fail_fast=False)
    assert shop.steps("o1") == [0, 2, 3]
    [again] = shop.bus.poisoned("s").entries()
    assert "after session 'o1' had moved on to 5" in again.entry.reason


def test_session_state_and_close(storage: Storage, prefix: str) -> None:
    shop = Shop(storage, prefix)
    shop.bus.send(Step(order="o1", n=0))
    shop.bus.send(Step(order="o1", n=1, last=True))
    shop.bus.send(Step(order="o1", n=2))
    shop.shuffle(seed=5)
    drain(shop.bus, fail_fast=False)
    assert shop.steps("o1") == [0, 1]
    info = shop.bus.sessions("s").get("o1")
    assert info is not None and info.closed and info.row.state == {"seen": [0, 1]}
    [letter] = shop.bus.poisoned("s").entries()  # 2: after the close, never handled
    assert letter.entry.envelope is not None and letter.entry.envelope.sequence == 3
    assert "closed" in letter.entry.reason
    assert shop.bus.read_state("s", "o1", "total") == {"n": 2}


def test_an_operator_skips_and_closes_sessions(storage: Storage, prefix: str) -> None:
    shop = Shop(storage, prefix, refuse={1, 11})
    for n in range(3):
        shop.bus.send(Step(order="o1", n=n))
        shop.bus.send(Step(order="o2", n=10 + n))
    drain(shop.bus, fail_fast=False)
    assert shop.steps("o1") == [0] and shop.steps("o2") == [10]
    sessions = shop.bus.sessions("s")
    assert sessions.skip("o1") == 1  # inside the window, by hand
    assert sessions.close("o2") == 1
    drain(shop.bus, fail_fast=False)
    assert shop.steps("o1") == [0, 2] and shop.steps("o2") == [10]
    info = sessions.get("o1")
    assert info is not None and [(g.first, g.by) for g in info.row.gaps] == [(2, "operator")]
    reasons = sorted(letter.entry.reason for letter in shop.bus.poisoned("s").entries())
    assert len(reasons) == 3 and sum("closed" in reason for reason in reasons) == 1
    assert sessions.skip("nobody") == 0


def test_a_message_in_a_session_cannot_be_deferred(storage: Storage, prefix: str) -> None:
    s = Endpoint("s")
    refused: list[str] = []

    @s.handles(Step, partition=lambda m: m.order, session=lambda m: m.order)
    def step(message: Step, ctx: Context) -> None:
        with pytest.raises(StateError) as raised:
            ctx.defer()
        refused.append(str(raised.value))

    bus = Bus(storage, [s], prefix=prefix)
    bus.provision()
    bus.send(Step(order="o1", n=0))
    assert drain(bus).total() == {"processed": 1}
    assert len(refused) == 1 and "cannot be deferred" in refused[0]


def _copy(n: int) -> Envelope:
    """Copy ``n`` of the client stream ``client:c`` in session ``o1``."""
    return Envelope.model_validate(dict(
        message_id=f"m{n}", attempt_id=f"a{n}", kind="command", message_type="Step",
        source="client", destination="s", correlation_id=f"m{n}",
        sent_at=datetime(2026, 11, 26, tzinfo=timezone.utc), payload="{}", session="o1",
        stream="client:c", sequence=n))


def _waiting(n: int) -> Waiting:
    return Waiting(stream="client:c", sequence=n, message_id=f"m{n}", generation=0, since=0.0)


def test_a_copy_set_aside_asks_for_a_release_only_when_a_skip_made_it_a_turn() -> None:
    # The predecessor's commit asks for the release of the copy whose turn it is; a copy set
    # aside before that one is handled must not ask again: each request sends its signal again.
    gaps = Gaps(window=60.0, skip=True)
    released_not_handled = SessionRow(streams={"client:c": 2}, waiting=(_waiting(2),))
    aside = plan(released_not_handled, "o1", _copy(3), 0, 10.0, gaps=gaps, endpoint="s")
    assert isinstance(aside, SetAside) and aside.releases == ()
    # 2 never came and 3 waited past the window: skipping to 3 makes it 3's turn.
    gap = SessionRow(streams={"client:c": 2}, waiting=(_waiting(3),))
    skipped = plan(gap, "o1", _copy(4), 0, 100.0, gaps=gaps, endpoint="s")
    assert isinstance(skipped, SetAside)
    assert [r.message_id for r in skipped.releases] == ["m3"]
    assert skipped.row.expected("client:c") == 3


@pytest.mark.parametrize("key", ["", "a/b", "x" * 300])
def test_a_bad_session_key_fails_the_send_with_the_reason(storage: Storage, prefix: str,
                                                          key: str) -> None:
    s = Endpoint("s")

    @s.handles(Step, partition=lambda m: m.order, session=lambda m: key)
    def step(message: Step, ctx: Context) -> None:
        return None

    bus = Bus(storage, [s], prefix=prefix)
    bus.provision()
    with pytest.raises(Exception, match="session key"):
        bus.send(Step(order="o1", n=0))


CLI_BUS: Bus | None = None
"""The bus ``python -m bus sessions --app tests.protocol.test_sessions:CLI_BUS`` finds (set by the
CLI test: the command imports this module, already imported, and reads the attribute)."""


def test_the_sessions_commands(storage: Storage, prefix: str,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    shop = Shop(storage, prefix, refuse={1, 11})
    for n in range(3):
        shop.bus.send(Step(order="o1", n=n))
        shop.bus.send(Step(order="o2", n=10 + n))
    shop.bus.send(Step(order="o3", n=20))
    drain(shop.bus, fail_fast=False)
    shop.clock.now += 90  # o1 and o2 stuck past the window
    monkeypatch.setattr(sys.modules[__name__], "CLI_BUS", shop.bus)
    runner, app = CliRunner(), ["--app", "tests.protocol.test_sessions:CLI_BUS"]
    listed = runner.invoke(main, ["sessions", "list", "s", *app])
    assert listed.exit_code == 0, listed.output
    lines = listed.output.splitlines()
    assert [line.split()[:2] for line in lines[:3]] == [
        ["o1", "stuck"], ["o2", "stuck"], ["o3", "open"]]
    assert "waiting 1 for 90.0 s" in lines[0] and lines[-1] == "3 session(s) at s, 2 stuck"
    as_json = runner.invoke(main, ["sessions", "list", "s", "--json", *app])
    first = json.loads(as_json.output.splitlines()[0])
    assert first["first_waiting"] == {"client:client": 3} and first["next"] == {
        "client:client": 2}
    shown = runner.invoke(main, ["sessions", "show", "s", "o3", *app])
    assert shown.exit_code == 0 and json.loads(shown.output)["row"]["state"] == {
        "seen": [20]}
    skipped = runner.invoke(main, ["sessions", "skip", "s", "o1", *app])
    assert skipped.exit_code == 0 and "1 waiting message(s) released" in skipped.output
    closed = runner.invoke(main, ["sessions", "close", "s", "o2", "--yes", *app])
    assert closed.exit_code == 0 and "1 waiting message(s) released" in closed.output
    missing = runner.invoke(main, ["sessions", "show", "s", "nope", *app])
    assert missing.exit_code == 2 and "no session 'nope'" in missing.output
    drain(shop.bus, fail_fast=False)
    assert shop.steps("o1") == [0, 2] and shop.steps("o2") == [10]
    after = runner.invoke(main, ["sessions", "list", "s", *app]).output.splitlines()
    assert [line.split()[:2] for line in after[:3]] == [
        ["o1", "open"], ["o3", "open"], ["o2", "closed"]]


def test_a_signature_covers_the_session_and_the_sequence() -> None:
    settings = Settings(signing=Signing(mode="required", key_id="k1", keys=(
        SigningKey(key_id="k1", secret=bytes([1]) * 32),)))
    shop_bus = Shop(InMemoryStorage(), "").bus
    bus = Bus(shop_bus.storage, list(shop_bus.topology.endpoints.values()), settings=settings)
    [copy] = bus.parts.addressing("client").envelopes(
        Step(order="o1", n=0), message_id="m1", correlation_id="m1", causation_id=None,
        sequencer=lambda destination, session: ("client:client", 3))
    assert (copy.session, copy.stream, copy.sequence) == ("o1", "client:client", 3)
    assert bus.parts.sealer.check(copy) is None
    for change in ({"sequence": 2}, {"stream": "client:other"}, {"session": "o2"}):
        assert bus.parts.sealer.check(copy.model_copy(update=change)) == "bad signature (key 'k1')"


def test_clients_of_one_name_share_their_stream_and_read_its_counter_once(
        storage: Storage, prefix: str) -> None:
    """Two processes' clients number one stream between them: every number once, in the
    order taken; a process reads the counter row again only after the other one wrote it."""
    shop = Shop(storage, prefix)
    counted, ops = counting_storage(storage)
    other = Bus(counted, list(shop.bus.topology.endpoints.values()), prefix=prefix,
                settings=Settings(signal_bundles=False))
    for n in range(4):
        shop.bus.send(Step(order="o1", n=n))
    ops.reset()
    for n in range(4, 7):
        other.send(Step(order="o1", n=n))
    assert ops.snapshot().get(("table", "get")) == 1  # its first send: it knew no row yet
    shop.bus.send(Step(order="o1", n=7))  # its memory is stale: a failed write, a read
    drain(shop.bus)
    assert shop.steps("o1") == list(range(8))
    assert shop.session("o1")["next"] == {"client:client": 9}


def test_an_operator_skips_past_a_copy_released_in_its_turn_and_then_poisoned(
        storage: Storage, prefix: str) -> None:
    """Its entry stays in the waiting list (a poisoned copy commits nothing); the skip drops
    it instead of releasing it again (which does nothing to a poisoned token) and moves on."""
    shop = Shop(storage, prefix, refuse={2})
    shop.bus.send(Step(order="o1", n=0), delay=1.0)
    for n in range(1, 4):
        shop.bus.send(Step(order="o1", n=n))
    drain(shop.bus)
    time.sleep(1.2)
    shop.clock.now += 2
    drain(shop.bus, fail_fast=False)
    assert shop.steps("o1") == [0, 1]  # 2 released in its turn, then poisoned; 3 waits
    assert shop.bus.sessions("s").skip("o1") == 1
    drain(shop.bus, fail_fast=False)
    assert shop.steps("o1") == [0, 1, 3]
    info = shop.bus.sessions("s").get("o1")
    assert info is not None and info.waiting == () and [
        (g.first, g.last) for g in info.row.gaps] == [(3, 3)]
