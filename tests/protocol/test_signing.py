"""Signed messages (docs/signing.md): a copy that is not signed by a configured key for its
source - tampered, signed with a wrong or removed key, unsigned where signatures are required -
is poisoned with the reason before any handler runs, its token untouched; signed copies go
through handlers, outboxes, claim checks, rotation, replay and the Spark reader. On the
in-memory backend and Azurite where storage matters."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from bus import Bus, Command, Context, Endpoint, Event
from bus.envelope import parse_envelope, split_bundle
from bus.errors import ConfigurationError
from bus.hosting.functions.config import AppConfig
from bus.integrations.spark.options import OptionError, connection_from
from bus.integrations.spark.reader import Drainer, staged_rows, subscribe
from bus.integrations.spark.staging import Staging
from bus.protocol.poison.poisoned import ReplayResult
from bus.protocol.records import OutboxRecord
from bus.protocol.tokens.inbox import TokenState
from bus.settings import Settings
from bus.signing import Signing, SigningKey
from bus.storage import Storage
from bus.testing import InMemoryStorage, drain

K0, K1, K2, WRONG = (bytes([n]) * 32 for n in (7, 1, 2, 9))
BIG = "n" * 60_000  # a payload over a queue message: a claim check


class Ping(Command):
    key: str
    note: str = ""


class Pinged(Event):
    key: str
    note: str = ""


def signing(mode: str = "required", sign_with: str = "k1", **keys: bytes | SigningKey,
            ) -> Settings:
    made = tuple(k if isinstance(k, SigningKey) else SigningKey(key_id=kid, secret=k)
                 for kid, k in keys.items())
    return Settings(signing=Signing(mode=mode, keys=made, key_id=sign_with))  # type: ignore[arg-type]


def app(storage: Storage, prefix: str, settings: Settings | None = None,
        ) -> tuple[Bus, list[str]]:
    """``desk`` handles Ping and publishes Pinged, which ``log`` subscribes to; ``seen``
    records every handler call."""
    desk, log = Endpoint("desk"), Endpoint("log")
    seen: list[str] = []

    @desk.handles(Ping, partition=lambda m: m.key)
    def ping(message: Ping, ctx: Context) -> None:
        seen.append(f"desk:{message.key}")
        ctx.state.put("ping", {"size": len(message.note)})
        ctx.publish(Pinged(key=message.key, note=message.note))

    @log.handles(Pinged, partition=lambda m: m.key)
    def pinged(message: Pinged, ctx: Context) -> None:
        seen.append(f"log:{message.key}")
        ctx.state.put("pinged", {"size": len(message.note)})

    bus = Bus(storage, [desk, log], prefix=prefix, settings=settings)
    bus.provision()
    return bus, seen


def take(bus: Bus, endpoint: str = "desk") -> list[dict[str, Any]]:
    """Every signal waiting at ``endpoint`` (bundles taken apart), off the queue."""
    queue = bus.names.queue(endpoint)
    found: list[dict[str, Any]] = []
    while messages := bus.storage.queues.receive(queue, max_messages=32, lease=60):
        for message in messages:
            for body in split_bundle(message.body) or [message.body]:
                found.append(json.loads(base64.b64decode(body)))
            bus.storage.queues.delete(queue, message)
    return found


def put(bus: Bus, document: dict[str, Any], endpoint: str = "desk") -> None:
    bus.storage.queues.send(bus.names.queue(endpoint),
                            base64.b64encode(json.dumps(document).encode()).decode())


def reasons(bus: Bus, endpoint: str = "desk") -> list[str]:
    return [letter.entry.reason for letter in bus.poisoned(endpoint).entries()]


# -- signed round trips ------------------------------------------------------------------------
def test_signed_commands_and_events_go_through_handlers_inline_and_by_claim_check(
        storage: Storage, prefix: str) -> None:
    bus, seen = app(storage, prefix, signing(k1=K1))
    bus.send(Ping(key="small"))
    bus.send(Ping(key="large", note=BIG))
    small, large = sorted(take(bus), key=lambda d: "payload_ref" in d)
    assert small["signature"]["key_id"] == "k1" and "payload" in small
    assert "payload_ref" in large and len(large["payload_sha256"]) == 64
    put(bus, small)
    put(bus, large)
    drain(bus)  # the events the handler published are signed too: none is poisoned
    assert sorted(seen) == ["desk:large", "desk:small", "log:large", "log:small"]
    assert bus.read_state("log", "large", "pinged") == {"size": len(BIG)}


def test_sign_only_accepts_unsigned_copies_and_signs_its_own(storage: Storage,
                                                              prefix: str) -> None:
    old, _ = app(storage, prefix)  # a sender before signing was turned on
    old.send(Ping(key="a"))
    bus, seen = app(storage, prefix, signing("sign-only", k1=K1))
    assert drain(bus).total() == {"processed": 2}
    bus.send(Ping(key="b"))
    [copy] = take(bus)
    assert copy["signature"]["key_id"] == "k1"
    assert seen == ["desk:a", "log:a"]


def test_every_send_path_signs(prefix: str) -> None:
    storage = InMemoryStorage()
    bus, _ = app(storage, prefix, signing(k1=K1))
    bus.send(Ping(key="a"))
    assert bus.send_once(Ping(key="b"), message_id="once-b")
    bus.publish(Pinged(key="c"))
    copies = take(bus, "desk") + take(bus, "log")
    assert len(copies) == 3
    assert all(bus.parts.sealer.check(parse_envelope(json.dumps(c).encode())) is None
               for c in copies)


def test_a_new_attempt_id_is_signed_again() -> None:
    """The dispatcher's fresh attempt ids (a helper completing another worker's record) and
    the sender's (a token request of unknown outcome) are signed anew: the signature covers
    the attempt id."""
    bus, _ = app(InMemoryStorage(), "", signing(k1=K1))
    outgoing = tuple(bus.parts.addressing("desk").envelopes(
        Pinged(key="k"), message_id="m1", correlation_id="m1", causation_id=None))
    record = OutboxRecord(endpoint="desk", message_id="i", attempt_id="a", outgoing=outgoing)
    fresh = record.with_fresh_attempts(bus.parts.new_id, bus.parts.sealer.resign).outgoing
    unsigned = record.with_fresh_attempts(bus.parts.new_id).outgoing
    assert [bus.parts.sealer.check(e) for e in fresh] == [None]
    assert [bus.parts.sealer.check(e) for e in unsigned] == ["bad signature (key 'k1')"]


# -- what is poisoned ----------------------------------------------------------------------------
@pytest.mark.parametrize(("field", "change"), [
    ("payload", lambda d: d["payload"].replace('"a"', '"b"')),
    ("message_type", lambda d: "Pinged"),
    ("source", lambda d: "desk"),
    ("headers", lambda d: {"tenant": "other"}),
    # another attempt id, whatever the last character was (a random id ends in "0" 1 time in 16)
    ("attempt_id", lambda d: d["attempt_id"][:-1] + ("1" if d["attempt_id"][-1] == "0" else "0")),
])
def test_a_tampered_copy_is_poisoned_and_its_handler_never_runs(
        storage: Storage, prefix: str, field: str, change: Any) -> None:
    bus, seen = app(storage, prefix, signing(k1=K1))
    bus.send(Ping(key="a"))
    [copy] = take(bus)
    put(bus, {**copy, field: change(copy)})
    assert drain(bus, fail_fast=False).total() == {"poisoned": 1}
    assert seen == [] and reasons(bus) == ["bad signature (key 'k1')"]


def test_a_tampered_claim_check_blob_is_poisoned(storage: Storage, prefix: str) -> None:
    bus, seen = app(storage, prefix, signing(k1=K1))
    bus.send(Ping(key="a", note=BIG))
    [copy] = take(bus)
    ref = copy["payload_ref"]
    bus.storage.blobs.write(ref["container"], ref["blob"],
                            json.dumps({"key": "a", "note": "forged"}).encode())
    put(bus, copy)
    assert drain(bus, fail_fast=False).total() == {"poisoned": 1}
    assert seen == []
    [letter] = bus.poisoned("desk").entries()
    assert letter.entry.reason.startswith("payload digest mismatch")
    assert letter.token is TokenState.LIVE  # not what was signed: its token is left alone


def test_a_copy_signed_with_a_wrong_key_is_poisoned(storage: Storage, prefix: str) -> None:
    sender, _ = app(storage, prefix, signing(k1=WRONG))
    sender.send(Ping(key="a"))
    bus, seen = app(storage, prefix, signing(k1=K1))
    assert drain(bus, fail_fast=False).total() == {"poisoned": 1}
    assert seen == [] and reasons(bus) == ["bad signature (key 'k1')"]


def test_an_unsigned_copy_is_poisoned_when_signatures_are_required(storage: Storage,
                                                                   prefix: str) -> None:
    sender, _ = app(storage, prefix)
    sender.send(Ping(key="a"))
    bus, seen = app(storage, prefix, signing(k1=K1))
    assert drain(bus, fail_fast=False).total() == {"poisoned": 1}
    assert seen == [] and reasons(bus) == ["unsigned message"]


def test_a_key_signs_only_for_its_sources(storage: Storage, prefix: str) -> None:
    """A foreign producer's key bound to its own source name: it authenticates ``source``."""
    shop_key = SigningKey(key_id="shop", secret=K1, sources=frozenset({"shop"}))
    receiving = signing(sign_with="k0", k0=K0, shop=shop_key)
    honest, _ = app(storage, prefix, signing(sign_with="shop", shop=K1).model_copy(
        update={"client_name": "shop"}))
    honest.send(Ping(key="honest"))
    spoofing, _ = app(storage, prefix, signing(sign_with="shop", shop=K1))  # as "client"
    spoofing.send(Ping(key="spoofed"))
    bus, seen = app(storage, prefix, receiving)
    assert drain(bus, fail_fast=False)["desk"] == {"processed": 1, "poisoned": 1}
    assert seen == ["desk:honest", "log:honest"]
    assert reasons(bus) == ["source 'client' not allowed for key 'shop'"]


# -- rotation and replay -----------------------------------------------------------------------
def test_rotation_old_copies_verify_while_their_key_is_configured(storage: Storage,
                                                                  prefix: str) -> None:
    old, _ = app(storage, prefix, signing(k1=K1))
    old.send(Ping(key="before"))  # signed with k1
    rotated, seen = app(storage, prefix, signing(sign_with="k2", k1=K1, k2=K2))
    rotated.send(Ping(key="after"))
    queued = take(rotated)
    assert sorted(c["signature"]["key_id"] for c in queued) == ["k1", "k2"]
    for copy in queued:
        put(rotated, copy)
    assert drain(rotated).total() == {"processed": 4}
    old.send(Ping(key="late"))  # signed with k1, arriving once k1 is removed
    retired, seen = app(storage, prefix, signing(sign_with="k2", k2=K2))
    assert drain(retired, fail_fast=False).total() == {"poisoned": 1}
    assert seen == [] and reasons(retired) == ["unknown signing key id 'k1'"]


def test_a_poisoned_copy_is_replayed_once_after_the_keys_are_fixed(storage: Storage,
                                                                   prefix: str) -> None:
    sender, _ = app(storage, prefix, signing(k1=K1))
    sender.send(Ping(key="a"))
    missing_key, _ = app(storage, prefix, signing(sign_with="k0", k0=K0))
    assert drain(missing_key, fail_fast=False).total() == {"poisoned": 1}
    [letter] = missing_key.poisoned("desk").entries()
    assert letter.entry.reason == "unknown signing key id 'k1'"
    assert letter.token is TokenState.LIVE  # an unverified copy does not poison its token
    fixed, seen = app(storage, prefix, signing(sign_with="k0", k0=K0, k1=K1))
    assert fixed.poisoned("desk").replay() == {letter.id: ReplayResult.RESENT}
    assert drain(fixed).total() == {"processed": 2}
    assert fixed.poisoned("desk").replay() == {}
    assert seen == ["desk:a", "log:a"]


def test_a_forged_copy_does_not_block_the_real_one(storage: Storage, prefix: str) -> None:
    """A forged copy naming a real copy's attempt id is poisoned without touching the token,
    so the real copy is still processed."""
    bus, seen = app(storage, prefix, signing(k1=K1))
    bus.send(Ping(key="real"))
    [copy] = take(bus)
    put(bus, {**copy, "payload": json.dumps({"key": "forged"})})
    put(bus, copy)
    assert drain(bus, fail_fast=False)["desk"] == {"poisoned": 1, "processed": 1}
    assert seen == ["desk:real", "log:real"]


def test_a_claim_check_copy_pointed_elsewhere_does_not_block_the_real_one(
        storage: Storage, prefix: str) -> None:
    """``payload_ref`` is outside the signature (the sender decides it after signing): a copy
    naming any blob but its own claim check is poisoned unread, and its token left alone, so
    the real copy is still processed."""
    bus, seen = app(storage, prefix, signing(k1=K1))
    bus.send(Ping(key="real", note=BIG))
    [copy] = take(bus)
    elsewhere = {**copy["payload_ref"], "blob": "log/someone-elses"}
    put(bus, {**copy, "payload_ref": elsewhere})
    put(bus, copy)
    assert drain(bus, fail_fast=False)["desk"] == {"poisoned": 1, "processed": 1}
    assert seen == ["desk:real", "log:real"]
    [reason] = reasons(bus)
    assert "is not this message's claim check" in reason


def test_a_drop_expiry_replay_never_signs_a_copy_whose_signature_does_not_hold(
        storage: Storage, prefix: str) -> None:
    """A forged copy with a junk signature and a time-to-live is poisoned as such; replaying
    it without its expiry would sign it anew with the app's key - so it is refused, kept."""
    bus, seen = app(storage, prefix, signing(k1=K1))
    bus.send(Ping(key="real"))
    [copy] = take(bus)
    forged = {**copy, "payload": json.dumps({"key": "forged"}),
              "expires_at": "2999-01-01T00:00:00Z"}
    put(bus, forged)
    assert drain(bus, fail_fast=False).total() == {"poisoned": 1}
    [letter] = bus.poisoned("desk").entries()
    assert letter.entry.reason == "bad signature (key 'k1')"
    assert bus.poisoned("desk").replay(drop_expiry=True) == {
        letter.id: ReplayResult.UNVERIFIED}
    assert drain(bus, fail_fast=False).total() == {}
    assert seen == [] and [e.id for e in bus.poisoned("desk").entries()] == [letter.id]


# -- the Spark reader ----------------------------------------------------------------------------
def test_the_spark_reader_takes_signed_copies_and_poisons_the_others() -> None:
    storage = InMemoryStorage()
    bus = Bus(storage, routes={Ping: "sink"}, settings=signing(k1=K1))
    Staging(storage, "").ensure()
    subscribe(bus, "sink")
    bus.send(Ping(key="good"), message_id="good")
    bus.send(Ping(key="big", note=BIG), message_id="big")
    bus.send(Ping(key="bad"), message_id="bad")
    for copy in take(bus, "sink"):
        put(bus, {**copy, "source": "someone"} if copy["message_id"] == "bad" else copy, "sink")
    drainer = Drainer(bus, Staging(storage, ""), "sink")
    assert drainer.stage("r~sink~a", 10, close_empty=True) == 2
    rows = staged_rows(Staging(storage, ""), "r~sink~a", None)
    assert sorted(row[0] for row in rows) == ["big", "good"]
    [entry] = bus.storage.queues.receive(bus.names.poison_queue("sink"), max_messages=2,
                                         lease=0)
    assert bus.parts.poison_queue("sink").read(entry.body).reason == "bad signature (key 'k1')"
    assert {t.state for t in bus.parts.inbox.all("sink")} == {TokenState.LIVE}  # "bad", token live


def test_spark_options_carry_the_keys() -> None:
    key = base64.b64encode(K1).decode()
    options = {"connection_string": "memory:", "signing": "required", "signing_key_id": "k1",
               "signing_keys": f"k1={key};shop={key}", "signing_sources": "shop=shop,till"}
    connection = connection_from(options)
    assert connection.settings is not None
    assert connection.settings.signing.key("shop") == SigningKey(
        key_id="shop", secret=K1, sources=frozenset({"shop", "till"}))
    assert "k1=" not in repr(connection)
    with pytest.raises(OptionError, match="signing_keys"):
        connection_from({**options, "signing_keys": "k1:abc"})


# -- start-up ------------------------------------------------------------------------------------
def config(tmp_path: Path, **settings: str) -> AppConfig:
    return AppConfig.from_environment({"AzureWebJobsStorage": "memory:", **settings},
                                      tmp_path / "host.json")


GOOD = base64.b64encode(K1).decode()


@pytest.mark.parametrize(("settings", "message"), [
    ({"BUS_SIGNING": "maybe"}, "BUS_SIGNING='maybe' is invalid: off, sign-only or required"),
    ({"BUS_SIGNING": "required", "BUS_SIGNING_KEY__k1": GOOD},
     "BUS_SIGNING=required needs BUS_SIGNING_KEY_ID"),
    ({"BUS_SIGNING": "required", "BUS_SIGNING_KEY_ID": "k9", "BUS_SIGNING_KEY__k1": GOOD},
     "BUS_SIGNING_KEY_ID='k9' names a key that is not configured: set BUS_SIGNING_KEY__k9"),
    ({"BUS_SIGNING": "required", "BUS_SIGNING_KEY_ID": "k1",
      "BUS_SIGNING_KEY__k1": base64.b64encode(b"short").decode()},
     "BUS_SIGNING_KEY__k1 holds 5 bytes: use at least 32"),
    ({"BUS_SIGNING": "required", "BUS_SIGNING_KEY_ID": "k1", "BUS_SIGNING_KEY__k1": "no!"},
     "BUS_SIGNING_KEY__k1 is not valid base64"),
    ({"BUS_SIGNING": "required", "BUS_SIGNING_KEY_ID": "k1",
      "BUS_SIGNING_KEY__k1": "@Microsoft.KeyVault(SecretUri=https://v.vault.azure.net/x)"},
     "BUS_SIGNING_KEY__k1 is an unresolved Key Vault reference"),
    ({"BUS_SIGNING_SOURCES__k7": "shop"}, "BUS_SIGNING_SOURCES__k7 names key 'k7'"),
    ({"BUS_SIGNING_KEY__my-key": GOOD}, "BUS_SIGNING_KEY__my-key: key ids are 1-32 letters"),
])
def test_bad_signing_settings_fail_at_start_up_saying_what_to_fix(
        tmp_path: Path, settings: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError, match="the bus cannot start") as failed:
        config(tmp_path, **settings)
    assert message in str(failed.value)


def test_signing_settings_with_one_setting_per_key(tmp_path: Path) -> None:
    found = config(tmp_path, BUS_SIGNING="sign-only", BUS_SIGNING_KEY_ID="k2",
                   BUS_SIGNING_KEY__k1=GOOD, BUS_SIGNING_KEY__k2=base64.b64encode(K2).decode(),
                   BUS_SIGNING_SOURCES__k1="shop, till").settings.signing
    assert found.mode == "sign-only" and found.signer().secret == K2
    assert found.key("k1") == SigningKey(key_id="k1", secret=K1,
                                         sources=frozenset({"shop", "till"}))
    assert GOOD not in repr(found)
    assert not config(tmp_path).settings.signing.on


def test_a_signing_key_that_may_not_sign_for_the_app_fails_at_start_up() -> None:
    bound = SigningKey(key_id="k1", secret=K1, sources=frozenset({"desk"}))
    with pytest.raises(ConfigurationError, match=r"may not sign for client, log"):
        app(InMemoryStorage(), "", signing(k1=bound))


def test_signing_in_code_is_checked_too() -> None:
    with pytest.raises(ValidationError, match="needs the id of the key"):
        Signing(mode="required", keys=(SigningKey(key_id="k1", secret=K1),))
    with pytest.raises(ValidationError, match="at least 32"):
        SigningKey(key_id="k1", secret=b"short")
