"""Encrypted payloads (docs/signing.md): AES-256-GCM, inline and by claim check, with key ids
and rotation; a payload that cannot be decrypted - another key, or a ciphertext moved into
another message - is poisoned with the reason before its handler runs. An encrypted envelope
is version 2: a reader of version 1 only poisons it with the version instead of misreading it.
On the in-memory backend and Azurite where storage matters."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import ClassVar

import pytest

from bus import Bus, Command, Context, Endpoint
from bus.encryption import Encryption, EncryptionKey
from bus.errors import ConfigurationError, UnreadableVersion
from bus.hosting.functions.config import AppConfig
from bus.integrations.spark.reader import Drainer, staged_rows, subscribe
from bus.integrations.spark.staging import Staging
from bus.settings import Settings
from bus.signing import Signing, SigningKey
from bus.storage import Storage
from bus.testing import InMemoryStorage, drain
from bus.versions import Format
from tests.protocol.test_signing import BIG, K1, Ping, app, put, reasons, take

E1, E2, WRONG = (bytes([n]) * 32 for n in (3, 4, 5))


def encrypting(encrypt_with: str | None = "e1", signed: bool = False,
               **keys: bytes) -> Settings:
    encryption = Encryption(keys=tuple(EncryptionKey(key_id=k, secret=v)
                                       for k, v in keys.items()), key_id=encrypt_with)
    signing = (Signing(mode="required", keys=(SigningKey(key_id="k1", secret=K1),),
                       key_id="k1") if signed else Signing())
    return Settings(encryption=encryption, signing=signing)


@pytest.mark.parametrize("signed", [False, True])
def test_encrypted_payloads_go_through_handlers_inline_and_by_claim_check(
        storage: Storage, prefix: str, signed: bool) -> None:
    bus, seen = app(storage, prefix, encrypting(signed=signed, e1=E1))
    bus.send(Ping(key="small"))
    bus.send(Ping(key="large", note=BIG))
    small, large = sorted(take(bus), key=lambda d: "payload_ref" in d)
    assert small["bus"] == 2 and small["encryption"]["key_id"] == "e1"
    assert "small" not in base64.b64decode(small["payload"]).decode("latin-1")
    ref = large["payload_ref"]
    assert b"nnnn" not in bus.storage.blobs.read(ref["container"], ref["blob"]).data
    assert ("signature" in small) is signed
    put(bus, small)
    put(bus, large)
    drain(bus)  # the events the handler published are encrypted (and signed) too
    assert sorted(seen) == ["desk:large", "desk:small", "log:large", "log:small"]
    assert bus.read_state("log", "large", "pinged") == {"size": len(BIG)}


def test_each_copy_has_its_own_nonce(prefix: str) -> None:
    bus, _ = app(InMemoryStorage(), prefix, encrypting(e1=E1))
    bus.send(Ping(key="a"), message_id="same")
    bus.send(Ping(key="a"), message_id="same")
    first, second = take(bus)
    assert first["encryption"]["nonce"] != second["encryption"]["nonce"]
    assert first["payload"] != second["payload"]


def test_a_payload_encrypted_with_another_key_is_poisoned(storage: Storage,
                                                          prefix: str) -> None:
    sender, _ = app(storage, prefix, encrypting(e1=WRONG))
    sender.send(Ping(key="a"))
    sender.send(Ping(key="b", note=BIG))
    bus, seen = app(storage, prefix, encrypting(e1=E1))
    assert drain(bus, fail_fast=False).total() == {"poisoned": 2}
    assert seen == []
    assert reasons(bus) == ["payload cannot be decrypted with key 'e1': another key encrypted "
                            "it, or it was altered or moved from another message"] * 2


def test_a_payload_of_an_unknown_key_is_poisoned(storage: Storage, prefix: str) -> None:
    sender, _ = app(storage, prefix, encrypting("e9", e9=E1))
    sender.send(Ping(key="a"))
    bus, seen = app(storage, prefix, encrypting(e1=E1))
    assert drain(bus, fail_fast=False).total() == {"poisoned": 1}
    assert seen == [] and reasons(bus) == ["unknown encryption key id 'e9'"]


def test_a_ciphertext_moved_into_another_message_is_poisoned(storage: Storage,
                                                             prefix: str) -> None:
    """The associated data binds the ciphertext to its message id, message type and
    destination: someone who can write the queue cannot move it into another message."""
    bus, seen = app(storage, prefix, encrypting(e1=E1))
    bus.send(Ping(key="secret"))
    bus.send(Ping(key="other"))
    secret, other = sorted(take(bus), key=lambda d: d["sent_at"])
    put(bus, {**other, "payload": secret["payload"], "encryption": secret["encryption"]})
    assert drain(bus, fail_fast=False).total() == {"poisoned": 1}
    assert seen == [] and reasons(bus)[0].startswith("payload cannot be decrypted")


def test_rotation_old_payloads_decrypt_while_their_key_is_configured(
        storage: Storage, prefix: str) -> None:
    old, _ = app(storage, prefix, encrypting(e1=E1))
    old.send(Ping(key="before"))
    rotated, seen = app(storage, prefix, encrypting("e2", e1=E1, e2=E2))
    rotated.send(Ping(key="after"))
    queued = take(rotated)
    assert sorted(c["encryption"]["key_id"] for c in queued) == ["e1", "e2"]
    for copy in queued:
        put(rotated, copy)
    assert drain(rotated).total() == {"processed": 4}
    assert sorted(seen) == ["desk:after", "desk:before", "log:after", "log:before"]


def test_turning_encryption_off_still_decrypts_what_is_queued(storage: Storage,
                                                              prefix: str) -> None:
    old, _ = app(storage, prefix, encrypting(e1=E1))
    old.send(Ping(key="a"))
    bus, seen = app(storage, prefix, encrypting(None, e1=E1))  # decrypt only
    drain(bus)
    assert seen == ["desk:a", "log:a"]


def test_a_version_1_reader_poisons_an_encrypted_envelope_with_its_version() -> None:
    bus, _ = app(InMemoryStorage(), "", encrypting(e1=E1))
    bus.send(Ping(key="a"))
    [copy] = take(bus)
    with pytest.raises(UnreadableVersion, match="envelope version 2 is newer than this bus "
                                                r"reads \(1\)"):
        Format("envelope", "bus", 1).read(copy)
    unencrypted, _ = app(InMemoryStorage(), "")
    unencrypted.send(Ping(key="b"))
    assert [c["bus"] for c in take(unencrypted)] == [1]  # what every reader reads


def test_the_spark_reader_decrypts() -> None:
    storage = InMemoryStorage()
    bus = Bus(storage, routes={Ping: "sink"}, settings=encrypting(signed=True, e1=E1))
    Staging(storage, "").ensure()
    subscribe(bus, "sink")
    bus.send(Ping(key="small"), message_id="small")
    bus.send(Ping(key="big", note=BIG), message_id="big")
    assert Drainer(bus, Staging(storage, ""), "sink").stage("r~s~a", 10, close_empty=True) == 2
    rows = {row[0]: json.loads(row[8]) for row in staged_rows(Staging(storage, ""), "r~s~a",
                                                              None)}
    assert rows == {"small": {"key": "small", "note": ""}, "big": {"key": "big", "note": BIG}}


def test_encryption_settings(tmp_path: Path) -> None:
    env = {"AzureWebJobsStorage": "memory:", "BUS_ENCRYPTION_KEY_ID": "e2",
           "BUS_ENCRYPTION_KEY__e1": base64.b64encode(E1).decode(),
           "BUS_ENCRYPTION_KEY__e2": base64.b64encode(E2).decode()}
    found = AppConfig.from_environment(env, tmp_path / "host.json").settings.encryption
    assert found.key_id == "e2" and found.key("e1") == EncryptionKey(key_id="e1", secret=E1)
    with pytest.raises(ConfigurationError, match="BUS_ENCRYPTION_KEY__e2 holds 16 bytes: it "
                                                 "must be exactly 32"):
        AppConfig.from_environment(
            {**env, "BUS_ENCRYPTION_KEY__e2": base64.b64encode(b"x" * 16).decode()},
            tmp_path / "host.json")
    with pytest.raises(ConfigurationError, match="BUS_ENCRYPTION_KEY_ID='e3' names a key"):
        AppConfig.from_environment({**env, "BUS_ENCRYPTION_KEY_ID": "e3"},
                                   tmp_path / "host.json")


class StrictPing(Command):
    """The receiver's contract for Ping: a key of digits only."""

    message_type: ClassVar[str] = "Ping"
    key: int


def test_a_payload_that_fails_validation_is_poisoned_without_quoting_its_values(
        storage: Storage, prefix: str) -> None:
    """Decrypted values never reach the poison queue, the log or the dashboard: the reason
    names the field and the rule, not the value."""
    sender, _ = app(storage, prefix, encrypting(e1=E1))
    sender.send(Ping(key="4111 1111 1111 1111"))
    desk = Endpoint("desk")

    @desk.handles(StrictPing, partition=lambda m: str(m.key))
    def strict(message: StrictPing, ctx: Context) -> None:
        raise AssertionError("never valid")

    receiver = Bus(storage, [desk], prefix=prefix, settings=encrypting(e1=E1))
    assert drain(receiver, fail_fast=False).total() == {"poisoned": 1}
    [reason] = reasons(receiver)
    assert reason.startswith("Ping failed validation: key:") and "4111 1111" not in reason
    [letter] = receiver.poisoned("desk").entries()
    assert "4111 1111" not in (letter.entry.exception or "")
