"""Time-to-live (``ttl=``, the envelope's ``expires_at``): a copy that arrives after it is
poisoned as expired before its handler runs, its token poisoned, once per message; a duplicate
of a processed message stays a duplicate; the signature covers the field only when it is set;
a replay can drop the expiry. On the in-memory backend and Azurite, with a clock the tests
move (scheduled deliveries on the in-memory backend, whose queues follow that clock)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from click.testing import CliRunner

from bus import Bus, Command, Context, Endpoint, Event
from bus.adapters.memory import Fault
from bus.envelope import carried_deliveries, parse_envelope, with_deliveries
from bus.hosting.worker import Worker
from bus.operations.cli import main
from bus.protocol.poison.poisoned import ReplayResult
from bus.protocol.tokens.inbox import TokenState
from bus.seams import Seams
from bus.settings import Settings
from bus.signing import Signing, SigningKey
from bus.storage import Storage
from bus.testing import InMemoryStorage, drain
from bus.testing.seamed import seamed_bus
from tests.protocol.test_signing import put, reasons, take

START = 1_900_000_000.0  # 2030-03-17T17:46:40Z
KEY = b"t" * 32
SIGNED = Settings(signing=Signing(mode="required", key_id="k1",
                                  keys=(SigningKey(key_id="k1", secret=KEY),)))
# the bus ``python -m bus dlq --app tests.protocol.test_ttl:cli_bus`` finds
cli_bus: Bus | None = None


class Remind(Command):
    ref: str
    note: str = ""


class Relay(Command):
    ref: str


class Shipped(Event):
    ref: str


class Probe(Command):
    ref: str


class Clock:
    """The bus's clock, and the in-memory queues' when passed as their hooks (no faults)."""

    def __init__(self) -> None:
        self.t = START

    def __call__(self) -> float:
        return self.t

    def now(self) -> float:
        return self.t

    def before_call(self, service: str, operation: str) -> Fault | None:
        return None

    def defer(self, effect: Callable[[], None]) -> None:  # pragma: no cover - no ghosts
        effect()


def build(storage: Storage, prefix: str, clock: Clock,
          settings: Settings | None = None) -> tuple[Bus, list[str]]:
    """``desk`` handles Remind (deferring a ``wait-`` one the first time), Relay (which
    sends a Remind and publishes Shipped, each living a minute) and Probe (which sends with
    bad ttls); ``audit`` and ``mail`` subscribe to Shipped. ``seen`` records every handler
    call."""
    desk, audit, mail = Endpoint("desk"), Endpoint("audit"), Endpoint("mail")
    seen: list[str] = []

    @desk.handles(Remind, partition=lambda m: m.ref)
    def remind(message: Remind, ctx: Context) -> None:
        if message.ref.startswith("wait-") and ctx.deferrals == 0:
            ctx.defer()
            return
        seen.append(f"desk:{message.ref}")
        ctx.state.put("reminded", {"note": message.note})

    @desk.handles(Relay, partition=lambda m: m.ref)
    def relay(message: Relay, ctx: Context) -> None:
        ctx.send(Remind(ref=message.ref), ttl=timedelta(minutes=1))
        ctx.publish(Shipped(ref=message.ref), ttl=60)

    @desk.handles(Probe, partition=lambda m: m.ref)
    def probe(message: Probe, ctx: Context) -> None:
        for send in (lambda: ctx.send(Remind(ref=message.ref), ttl=0),
                     lambda: ctx.publish(Shipped(ref=message.ref), ttl=timedelta(seconds=-1))):
            try:
                send()
            except ValueError as exc:
                seen.append(f"refused: {exc}")

    for endpoint in (audit, mail):
        @endpoint.handles(Shipped, partition=lambda m: m.ref)
        def shipped(message: Shipped, ctx: Context, name: str = endpoint.name) -> None:
            seen.append(f"{name}:{message.ref}")

    bus = seamed_bus(Seams(clock=clock), storage, [desk, audit, mail], prefix=prefix,
                     settings=settings)
    bus.provision()
    return bus, seen


def at(moment: float) -> str:
    return datetime.fromtimestamp(moment, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- expiring ----------------------------------------------------------------------------------
def test_an_expired_command_is_poisoned_and_its_handler_never_runs(storage: Storage,
                                                                   prefix: str) -> None:
    clock = Clock()
    bus, seen = build(storage, prefix, clock)
    bus.send(Remind(ref="late"), ttl=30)
    clock.t += 30
    assert drain(bus, fail_fast=False).total() == {"expired": 1}
    assert seen == [] and bus.read_state("desk", "late", "reminded") is None
    [letter] = bus.poisoned("desk").entries()
    assert letter.entry.reason == (f"expired: its time-to-live ended at {at(START + 30)} "
                                   f"(received at {at(START + 30)})")
    assert letter.token is TokenState.POISONED and letter.replayable


def test_an_expired_copy_whose_payload_is_gone_is_poisoned_as_expired(storage: Storage,
                                                                      prefix: str) -> None:
    """Its claim-check blob gone, an expired copy is still poisoned as expired (a live one
    would be poisoned for the missing blob)."""
    clock = Clock()
    bus, seen = build(storage, prefix, clock)
    bus.send(Remind(ref="big", note="n" * 60_000), ttl=30)
    [blob] = bus.storage.blobs.list(bus.names.payload_container)
    bus.storage.blobs.delete(bus.names.payload_container, blob)
    clock.t += 31
    assert drain(bus, fail_fast=False).total() == {"expired": 1}
    [reason] = reasons(bus)
    assert reason.startswith("expired: its time-to-live ended at") and seen == []


def test_an_unexpired_command_is_handled(storage: Storage, prefix: str) -> None:
    clock = Clock()
    bus, seen = build(storage, prefix, clock)
    bus.send(Remind(ref="soon"), ttl=timedelta(seconds=30))
    clock.t += 29.9
    assert drain(bus).total() == {"processed": 1}
    assert seen == ["desk:soon"] and bus.poisoned("desk").entries() == []


@pytest.mark.parametrize(("expires_at", "shown"), [
    ("2030-03-17T17:46:39", "2030-03-17T17:46:39Z"),  # without a zone: UTC
    ("2030-03-17T18:46:39+01:00", "2030-03-17T17:46:39Z"),
    (-1, "1969-12-31T23:59:59Z"),  # seconds since the epoch
    ("0001-01-01T00:00:00", "0001-01-01T00:00:00Z"),
])
def test_any_past_expiry_a_copy_carries_is_read_without_failing(expires_at: object,
                                                                shown: str) -> None:
    bus, seen = build(InMemoryStorage(), "p", Clock())
    bus.send(Remind(ref="x"))
    [copy] = take(bus)
    put(bus, {**copy, "expires_at": expires_at})
    assert drain(bus, fail_fast=False).total() == {"expired": 1} and seen == []
    assert reasons(bus) == [f"expired: its time-to-live ended at {shown} (received at "
                            f"{at(START)})"]


def test_an_expiry_without_a_utc_form_is_an_invalid_envelope() -> None:
    bus, seen = build(InMemoryStorage(), "p", Clock())
    bus.send(Remind(ref="x"))
    [copy] = take(bus)
    put(bus, {**copy, "expires_at": "0001-01-01T00:00:00+01:00"})
    assert drain(bus, fail_fast=False).total() == {"poisoned": 1} and seen == []
    [reason] = reasons(bus)
    assert reason.startswith("envelope is invalid: expires_at") and "no UTC form" in reason


def test_the_time_to_live_counts_from_when_the_message_is_due() -> None:
    bus, _ = build(InMemoryStorage(), "p", Clock())
    [envelope] = bus.parts.addressing("client").envelopes(
        Remind(ref="x"), message_id="m", correlation_id="m", causation_id=None,
        delay=90.0, ttl=30.0)
    assert envelope.sent_at.timestamp() == START
    assert envelope.not_before is not None and envelope.not_before.timestamp() == START + 90
    assert envelope.expires_at is not None and envelope.expires_at.timestamp() == START + 120
    assert '"expires_at":"2030-03-17T17:48:40Z"' in envelope.to_json()
    [forever] = bus.parts.addressing("client").envelopes(
        Remind(ref="x"), message_id="m", correlation_id="m", causation_id=None)
    assert forever.expires_at is None and "expires_at" not in forever.to_json()


def test_a_scheduled_message_is_handled_when_due_and_expires_after() -> None:
    clock = Clock()
    bus, seen = build(InMemoryStorage(hooks=clock), "p", clock)
    worker = Worker(bus, "desk")
    bus.send(Remind(ref="due"), delay=60, ttl=30)
    bus.send(Remind(ref="missed"), delay=60, ttl=10)
    clock.t += 59
    assert worker.poll_once() == 0  # not due yet (hidden), and not expired either
    clock.t += 21  # both due 20 s ago: "due" lives 10 s more, "missed" expired 10 s ago
    assert worker.poll_once() == 2 and worker.outcomes == {"processed": 1, "expired": 1}
    assert seen == ["desk:due"]
    [reason] = reasons(bus)
    assert reason.startswith(f"expired: its time-to-live ended at {at(START + 70)}")


def test_a_copy_put_back_until_due_keeps_its_expiry() -> None:
    """A delay beyond the queue's 7 days: the copy arrives early and is put back as it is,
    ``expires_at`` included - handled within its time-to-live after it is due, not before."""
    clock = Clock()
    bus, seen = build(InMemoryStorage(hooks=clock), "p", clock)
    worker = Worker(bus, "desk")
    bus.send(Remind(ref="later"), delay=timedelta(days=9), ttl=timedelta(hours=1))
    clock.t += 7 * 24 * 3600  # the longest a queue hides a message: it shows up early
    assert worker.poll_once() == 1 and worker.outcomes == {"scheduled": 1}
    clock.t += 2 * 24 * 3600 + 1800  # due half an hour ago: still alive
    assert worker.poll_once() == 1 and worker.outcomes == {"scheduled": 1, "processed": 1}
    assert seen == ["desk:later"]


def test_a_copy_the_functions_trigger_puts_back_keeps_its_expiry() -> None:
    clock = Clock()
    bus, _ = build(InMemoryStorage(), "p", clock, SIGNED)
    bus.send(Remind(ref="x"), ttl=60)
    [sent] = take(bus)
    raw = json.dumps(sent).encode()
    counted = with_deliveries(raw, 4, bus.storage.queues.limits.signal_bytes)
    assert counted is not None
    bare, carried = carried_deliveries(counted)
    again = parse_envelope(bare)
    assert carried == 4 and again.expires_at == parse_envelope(raw).expires_at is not None
    assert bus.parts.sealer.check(again) is None


def test_messages_a_handler_sends_and_publishes_expire_at_each_destination(
        storage: Storage, prefix: str) -> None:
    clock = Clock()
    bus, seen = build(storage, prefix, clock)
    bus.send(Relay(ref="r"))
    assert Worker(bus, "desk").poll_once() == 1  # the Relay; what it sent waits
    clock.t += 61
    drained = drain(bus, fail_fast=False)
    assert {name: drained[name] for name in ("desk", "audit", "mail")} == {
        "desk": {"expired": 1}, "audit": {"expired": 1}, "mail": {"expired": 1}}
    assert seen == []
    for endpoint in ("desk", "audit", "mail"):
        [reason] = reasons(bus, endpoint)
        assert reason.startswith(f"expired: its time-to-live ended at {at(START + 60)}")


def test_an_event_published_with_a_ttl_expires_at_each_subscriber(storage: Storage,
                                                                   prefix: str) -> None:
    clock = Clock()
    bus, seen = build(storage, prefix, clock)
    bus.publish(Shipped(ref="e"), ttl=10)
    bus.publish(Shipped(ref="kept"))  # no time-to-live: never expires
    clock.t += 3600
    drained = drain(bus, fail_fast=False)
    assert drained["audit"] == drained["mail"] == {"expired": 1, "processed": 1}
    assert sorted(seen) == ["audit:kept", "mail:kept"]
    for endpoint in ("audit", "mail"):
        [letter] = bus.poisoned(endpoint).entries()
        assert letter.entry.envelope is not None and letter.entry.envelope.destination == endpoint
        assert letter.entry.reason.startswith(f"expired: its time-to-live ended at "
                                              f"{at(START + 10)}")


# -- once per message --------------------------------------------------------------------------
def test_a_duplicate_of_a_processed_message_that_expired_since_is_dropped(
        storage: Storage, prefix: str) -> None:
    clock = Clock()
    bus, seen = build(storage, prefix, clock)
    bus.send(Remind(ref="once"), ttl=30)
    [copy] = take(bus)
    put(bus, copy)
    assert drain(bus).total() == {"processed": 1}
    clock.t += 31
    put(bus, copy)  # a late copy of it (a sender's retry, a redelivery)
    assert drain(bus, fail_fast=False).total() == {"duplicate": 1}
    assert seen == ["desk:once"] and bus.poisoned("desk").entries() == []


def test_copies_of_an_expired_message_make_one_poison_entry(storage: Storage,
                                                           prefix: str) -> None:
    clock = Clock()
    bus, seen = build(storage, prefix, clock)
    bus.send(Remind(ref="twice"), ttl=30)
    [copy] = take(bus)
    put(bus, copy)
    put(bus, copy)
    clock.t += 31
    assert drain(bus, fail_fast=False).total() == {"expired": 1, "already_poisoned": 1}
    assert len(reasons(bus)) == 1 and seen == []


def test_a_message_that_expires_while_deferred_is_poisoned_when_released(
        storage: Storage, prefix: str) -> None:
    clock = Clock()
    bus, seen = build(storage, prefix, clock)
    waiting = bus.send(Remind(ref="wait-1"), ttl=60)
    kept = bus.send(Remind(ref="wait-2"), ttl=3600)
    assert drain(bus).total() == {"deferred": 2}
    clock.t += 61
    deferred = bus.deferred("desk")
    assert deferred.release(waiting) is True and deferred.release(kept) is True
    assert drain(bus, fail_fast=False).total() == {"expired": 1, "processed": 1}
    assert seen == ["desk:wait-2"]
    [letter] = bus.poisoned("desk").entries()
    assert letter.entry.reason.startswith(f"expired: its time-to-live ended at "
                                          f"{at(START + 60)}")
    assert letter.entry.envelope is not None and letter.entry.envelope.message_id == waiting


# -- replaying ---------------------------------------------------------------------------------
@pytest.mark.parametrize("settings", [None, SIGNED], ids=["unsigned", "signed"])
def test_a_replayed_expired_message_expires_again_unless_its_expiry_is_dropped(
        storage: Storage, prefix: str, settings: Settings | None) -> None:
    clock = Clock()
    bus, seen = build(storage, prefix, clock, settings)
    bus.send(Remind(ref="old"), ttl=30)
    clock.t += 31
    assert drain(bus, fail_fast=False).total() == {"expired": 1}
    letters = bus.poisoned("desk")
    [first] = letters.entries()
    assert letters.replay() == {first.id: ReplayResult.REPLAYED}
    assert drain(bus, fail_fast=False).total() == {"expired": 1}  # as sent: it expires again
    [second] = letters.entries()
    assert second.entry.reason.startswith("expired") and seen == []
    assert letters.replay(drop_expiry=True) == {second.id: ReplayResult.REPLAYED}
    assert drain(bus).total() == {"processed": 1}  # (signed again: no bad signature)
    assert seen == ["desk:old"] and letters.entries() == []


def test_the_dlq_commands_list_expired_messages_and_replay_them_without_expiry(
        storage: Storage, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    bus, seen = build(storage, prefix, clock)
    monkeypatch.setattr(f"{__name__}.cli_bus", bus)
    bus.send(Remind(ref="cli"), ttl=30)
    clock.t += 31
    drain(bus, fail_fast=False)
    runner = CliRunner()
    app = ["--app", f"{__name__}:cli_bus"]
    listed = runner.invoke(main, ["dlq", "list", "desk", "--json", *app])
    assert listed.exit_code == 0, listed.output
    [row] = [json.loads(line) for line in listed.output.splitlines()]
    assert row["reason"].startswith("expired: its time-to-live ended at")
    assert row["expires_at"] == "2030-03-17T17:47:10+00:00" and row["token"] == "poisoned"
    replayed = runner.invoke(main, ["dlq", "replay", "desk", "--all", "--drop-expiry", *app])
    assert replayed.exit_code == 0 and f"{row['id']}  replayed" in replayed.output
    assert drain(bus).total() == {"processed": 1} and seen == ["desk:cli"]


# -- the signature -----------------------------------------------------------------------------
def signed_copy(ttl: float | None) -> tuple[Bus, dict[str, Any]]:
    bus, _ = build(InMemoryStorage(), "p", Clock(), SIGNED)
    bus.send(Remind(ref="s"), ttl=ttl)
    [copy] = take(bus)
    return bus, copy


def check(bus: Bus, document: dict[str, Any]) -> str | None:
    return bus.parts.sealer.check(parse_envelope(json.dumps(document).encode()))


def test_the_signature_covers_expires_at() -> None:
    bus, copy = signed_copy(ttl=30)
    assert copy["expires_at"] == "2030-03-17T17:47:10Z" and check(bus, copy) is None
    later = {**copy, "expires_at": "2030-03-18T17:47:10Z"}  # a day longer
    without = {k: v for k, v in copy.items() if k != "expires_at"}
    assert check(bus, later) == check(bus, without) == "bad signature (key 'k1')"


def test_a_tampered_expiry_is_poisoned_as_a_bad_signature(storage: Storage,
                                                          prefix: str) -> None:
    clock = Clock()
    bus, seen = build(storage, prefix, clock, SIGNED)
    bus.send(Remind(ref="t"), ttl=30)
    [copy] = take(bus)
    put(bus, {**copy, "expires_at": "2031-01-01T00:00:00Z"})
    clock.t += 60
    assert drain(bus, fail_fast=False).total() == {"poisoned": 1}
    assert seen == [] and reasons(bus) == ["bad signature (key 'k1')"]


def test_a_copy_without_expires_at_is_signed_as_before() -> None:
    """The canonical form of a copy without ``expires_at`` has no such key: the documented
    form (docs/envelope.md, as a foreign producer builds it) verifies as it always did - and
    adding the field to such a copy breaks its signature."""
    bus, copy = signed_copy(ttl=None)
    assert "expires_at" not in copy and check(bus, copy) is None
    envelope = parse_envelope(json.dumps(copy).encode())
    documented = {
        "message_id": copy["message_id"], "attempt_id": copy["attempt_id"],
        "kind": "command", "message_type": "Remind", "source": "client",
        "destination": "desk", "topic": None, "correlation_id": copy["correlation_id"],
        "causation_id": None, "headers": {}, "sent_at": "2030-03-17T17:46:40.000000Z",
        "not_before": None, "content_type": "application/json",
        "payload_sha256": hashlib.sha256(envelope.inline_payload()).hexdigest(),
        "encryption": None, "key_id": "k1",
    }
    form = json.dumps(documented, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    expected = base64.b64encode(hmac.new(KEY, form.encode("utf-8"), hashlib.sha256).digest())
    assert copy["signature"]["hmac"] == expected.decode("ascii")
    assert check(bus, {**copy, "expires_at": "2031-01-01T00:00:00Z"}) == (
        "bad signature (key 'k1')")


# -- what is refused -----------------------------------------------------------------------------
BAD_TTLS: list[Any] = [0, -1, 0.0, -0.5, math.nan, math.inf, timedelta(0),
                       timedelta(seconds=-5), True, "10"]


@pytest.mark.parametrize("ttl", BAD_TTLS, ids=repr)
def test_a_ttl_that_is_not_a_positive_number_of_seconds_is_refused(ttl: Any) -> None:
    bus, _ = build(InMemoryStorage(), "p", Clock())
    sends: list[Callable[[], object]] = [
        lambda: bus.send(Remind(ref="x"), ttl=ttl),
        lambda: bus.publish(Shipped(ref="x"), ttl=ttl),
        lambda: bus.send_once(Remind(ref="x"), message_id="once", ttl=ttl),
        lambda: bus.publish_once(Shipped(ref="x"), message_id="once", ttl=ttl),
        lambda: bus.send_once_many([(Remind(ref="x"), "many")], ttl=ttl),
    ]
    for send in sends:
        with pytest.raises(ValueError, match=r"ttl must be a number of seconds > 0"):
            send()
    assert take(bus) == [] and take(bus, "audit") == []


def test_a_ttl_beyond_the_latest_time_an_envelope_carries_is_refused() -> None:
    bus, _ = build(InMemoryStorage(), "p", Clock())
    with pytest.raises(ValueError, match=r"ttl of 1e\+300 seconds ends after the latest time"):
        bus.send(Remind(ref="x"), ttl=1e300)


def test_a_handler_sending_with_a_bad_ttl_is_refused_before_anything_is_recorded(
        ) -> None:
    bus, seen = build(InMemoryStorage(), "p", Clock())
    bus.send(Probe(ref="p"))
    assert drain(bus).total() == {"processed": 1}
    assert seen == ["refused: ttl must be a number of seconds > 0 (or a timedelta; None: the "
                    "message never expires), not 0",
                    "refused: ttl must be a number of seconds > 0 (or a timedelta; None: the "
                    "message never expires), not -1.0"]
