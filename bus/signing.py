"""Signed messages: HMAC-SHA256 over each copy's envelope, with key ids and rotation.

Documented in docs/signing.md (how to turn it on, what it protects and what it does not) and
docs/envelope.md (the fields). A copy is signed when its envelope is created, before it is
stored anywhere (outbox record, send ledger), and again only when it gets a new attempt id;
everything that re-sends it later (redelivery, a released deferral, a poison-queue replay)
sends those exact bytes. The receiver verifies before any handler runs.

The signature covers the **canonical form** of the copy (``canonical``): a sorted-key compact
JSON document of every envelope field but those ``UNSIGNED`` lists, each with why, UTF-8 - so
a producer without this package can sign too. The payload is covered through its SHA-256
digest. A field added after the first form (``expires_at``, the session's) is in the form
only when the copy has it, so the form of a copy without it is what it was before the field
existed.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

if TYPE_CHECKING:
    from bus.envelope import Envelope

KEY_ID_PATTERN = r"^[A-Za-z0-9]{1,32}$"
"""Key ids: letters and digits (each key is an app setting of its own, ``BUS_SIGNING_KEY__<id>``,
and app setting names take only letters, digits, ``_`` and ``.``)."""
MIN_SECRET_BYTES = 32
"""The shortest signing key accepted: HMAC-SHA256's own output size."""

SigningMode = Literal["off", "sign-only", "required"]
"""``off``: nothing signed or checked. ``sign-only`` (the roll-out): every copy sent is signed,
a signed copy received is verified, an unsigned one is accepted. ``required``: an unsigned copy
is poisoned too."""

_KEY_ID = re.compile(KEY_ID_PATTERN)


class SigningKey(BaseModel):
    """One key: its id (carried in each signature), its secret, and the ``sources`` it may
    sign for (None: any source - the app's own keys; a foreign producer's key should name the
    producer's source names only, which is what authenticates ``source``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key_id: str = Field(pattern=KEY_ID_PATTERN)
    secret: bytes = Field(min_length=MIN_SECRET_BYTES, repr=False)
    sources: frozenset[str] | None = None

    def allows(self, source: str) -> bool:
        return self.sources is None or source in self.sources


class Signing(BaseModel):
    """Which keys verify, which one signs (``key_id``), and the mode (``SigningMode``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: SigningMode = "off"
    keys: tuple[SigningKey, ...] = ()
    key_id: str | None = None
    """The key new copies are signed with; it must be one of ``keys``."""

    @model_validator(mode="after")
    def _consistent(self) -> Signing:
        ids = [key.key_id for key in self.keys]
        if len(set(ids)) != len(ids):
            raise ValueError(f"signing key ids must be unique: {', '.join(ids)}")
        if self.mode != "off" and self.key_id is None:
            raise ValueError(f"signing mode {self.mode!r} needs the id of the key to sign "
                             "with (key_id)")
        if self.key_id is not None and self.key_id not in ids:
            raise ValueError(f"the signing key id {self.key_id!r} is not one of the keys "
                             f"configured ({', '.join(ids) or 'none'})")
        return self

    @property
    def on(self) -> bool:
        return self.mode != "off"

    def key(self, key_id: str) -> SigningKey | None:
        return next((key for key in self.keys if key.key_id == key_id), None)

    def signer(self) -> SigningKey:
        """The key new copies are signed with (only when ``on``)."""
        assert self.key_id is not None
        key = self.key(self.key_id)
        assert key is not None
        return key


def payload_digest(data: bytes) -> str:
    """The SHA-256 of payload bytes, lower-case hex: what the canonical form carries (and a
    claim-check envelope as ``payload_sha256``)."""
    return hashlib.sha256(data).hexdigest()


def instant(moment: datetime) -> str:
    """A time as the canonical form writes it: UTC, microseconds, ``Z``
    (``2026-11-22T10:00:00.000000Z``); a time without a zone is taken as UTC. Raises
    OverflowError or ValueError for a time that has no UTC form (year 1 at +01:00)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    utc = moment.astimezone(timezone.utc).replace(tzinfo=None)
    return utc.isoformat(timespec="microseconds") + "Z"


UNSIGNED: dict[str, str] = {
    "bus": "the envelope's version, set from the content: 2 exactly when `encryption` (signed) "
           "is set",
    "payload": "covered through the SHA-256 of its bytes (`payload_sha256` in the form)",
    "payload_encoding": "how the payload's bytes are written in the JSON; the bytes are covered "
                        "through their SHA-256",
    "payload_ref": "where a claim-check copy's payload is: the sender decides it after signing "
                   "(a copy too large to travel inline), and a receiver reads only the copy's "
                   "own claim check, which `destination` and `attempt_id` (signed) name - a "
                   "copy naming anything else is poisoned unread, its token left alone",
    "payload_sha256": "the form's `payload_sha256` is the digest of the payload's bytes, "
                      "whatever the field says: of an inline payload, computed (the field is "
                      "not read); of a claim check, the field, which the receiver checks "
                      "against the blob once read",
    "signature": "the signature itself",
}
"""The envelope fields the canonical form leaves out, each with why that is safe. Every other
field of ``Envelope`` is signed, a field added later too (``canonical`` walks the model's
fields); ``deliveries``, which the transport adds and takes off again, is not an envelope field
(``bus.envelope.DELIVERIES``), and an unknown field is dropped when a copy is decoded."""

FIRST_FORM_NULLS = frozenset({"topic", "causation_id", "not_before", "encryption"})
"""Fields of the first canonical form, written ``null`` when absent. Every field added since
is left out when absent, so the canonical form of a copy without it - one signed before the
field existed, or by a foreign producer that does not know it - is the form it always was."""


def canonical(envelope: Envelope, payload_sha256: str, key_id: str) -> bytes:
    """The bytes a copy's signature is the HMAC-SHA256 of (docs/envelope.md, "Signatures"):
    every envelope field but ``UNSIGNED``, with ``payload_sha256`` the digest of the payload's
    bytes and ``key_id`` the signing key's."""
    document: dict[str, Any] = {}
    for name in type(envelope).model_fields:
        value = getattr(envelope, name)
        if name in UNSIGNED or (value is None and name not in FIRST_FORM_NULLS):
            continue
        document[name] = _form(value)
    document.update(payload_sha256=payload_sha256, key_id=key_id)
    return json.dumps(document, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False).encode("utf-8")


def _form(value: object) -> object:
    """A field's value as the canonical form writes it."""
    if isinstance(value, datetime):
        return instant(value)
    if isinstance(value, BaseModel):
        return value.model_dump()
    return value


def mac(secret: bytes, data: bytes) -> str:
    """HMAC-SHA256 of ``data``, base64 (standard alphabet, padded)."""
    return base64.b64encode(hmac.new(secret, data, hashlib.sha256).digest()).decode("ascii")


def secret_from_text(text: str, name: str) -> bytes:
    """A key's secret from its base64 text (as an app setting or a Key Vault secret holds
    it); ValueError naming ``name`` when it is not base64."""
    try:
        return base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"{name} is not valid base64 ({exc})") from None


def keys_from_text(text: str, name: str) -> dict[str, bytes]:
    """Keys written as one text, ``kid1=<base64>;kid2=<base64>`` (Spark options, scripts)."""
    keys: dict[str, bytes] = {}
    for item in filter(None, (part.strip() for part in text.split(";"))):
        key_id, sep, value = item.partition("=")
        key_id = key_id.strip()
        if not sep or not _KEY_ID.match(key_id):
            raise ValueError(f"{name}: write each key as <id>=<base64>, ids of 1-32 letters "
                             f"and digits, separated by ';' (not {key_id[:40]!r})")
        keys[key_id] = secret_from_text(value, f"{name} key {key_id!r}")
    return keys


def sources_from_text(text: str) -> frozenset[str] | None:
    """A key's sources, comma-separated; ``*`` (or nothing) for any source."""
    names = frozenset(n.strip() for n in text.split(",") if n.strip())
    return None if not names or "*" in names else names


def signing_from_settings(env: Mapping[str, str], problems: list[str]) -> Signing:
    """``Signing`` from app settings (docs/signing.md): ``BUS_SIGNING`` (the mode),
    ``BUS_SIGNING_KEY_ID``, one ``BUS_SIGNING_KEY__<id>`` per key (each may be a Key Vault
    reference) and optional ``BUS_SIGNING_SOURCES__<id>``. Problems are appended to
    ``problems``, each saying what to set; the result is then ``Signing()`` (off)."""
    mode = env.get("BUS_SIGNING", "").strip() or "off"
    if mode not in ("off", "sign-only", "required"):
        problems.append(f"BUS_SIGNING={mode!r} is invalid: off, sign-only or required")
        return Signing()
    secrets = settings_keys(env, "BUS_SIGNING_KEY__", MIN_SECRET_BYTES, None, problems)
    keys = [SigningKey(key_id=key_id, secret=secret, sources=sources_from_text(
                env.get(f"BUS_SIGNING_SOURCES__{key_id}", "")))
            for key_id, secret in secrets.items()]
    for name in env:
        if name.startswith("BUS_SIGNING_SOURCES__") and name[21:] not in secrets:
            problems.append(f"{name} names key {name[21:]!r}, but BUS_SIGNING_KEY__{name[21:]} "
                            "is not set")
    key_id = env.get("BUS_SIGNING_KEY_ID", "").strip() or None
    problems.extend(unknown_key("BUS_SIGNING_KEY_ID", key_id, secrets, "BUS_SIGNING_KEY__"))
    if mode != "off" and key_id is None:
        problems.append(f"BUS_SIGNING={mode} needs BUS_SIGNING_KEY_ID: the id of the key "
                        "new messages are signed with (one of the BUS_SIGNING_KEY__<id>)")
    if mode == "off" or key_id is None or key_id not in secrets or problems:
        return Signing()
    return Signing(mode=mode, keys=tuple(keys), key_id=key_id)


def settings_keys(env: Mapping[str, str], prefix: str, least: int, exact: int | None,
                  problems: list[str]) -> dict[str, bytes]:
    """The keys of app settings named ``<prefix><id>``, each base64 of at least ``least``
    (or exactly ``exact``) bytes; problems appended, each naming its setting."""
    keys: dict[str, bytes] = {}
    for name, value in sorted(env.items()):
        if not name.startswith(prefix):
            continue
        key_id = name[len(prefix):]
        if not _KEY_ID.match(key_id):
            problems.append(f"{name}: key ids are 1-32 letters and digits")
            continue
        if value.strip().startswith("@Microsoft.KeyVault("):
            problems.append(f"{name} is an unresolved Key Vault reference: give the app's "
                            "identity 'get' on the secret (Key Vault Secrets User) and check "
                            "the reference (docs/signing.md)")
            continue
        try:
            secret = secret_from_text(value, name)
        except ValueError as exc:
            problems.append(f"{exc}: set it to a random key, e.g. `openssl rand -base64 32`")
            continue
        if exact is not None and len(secret) != exact:
            problems.append(f"{name} holds {len(secret)} bytes: it must be exactly {exact} "
                            f"(`openssl rand -base64 {exact}`)")
        elif len(secret) < least:
            problems.append(f"{name} holds {len(secret)} bytes: use at least {least} random "
                            f"bytes (`openssl rand -base64 {least}`)")
        else:
            keys[key_id] = secret
    return keys


def unknown_key(setting: str, key_id: str | None, keys: Mapping[str, bytes],
                 prefix: str) -> list[str]:
    if key_id is None or key_id in keys:
        return []
    return [f"{setting}={key_id!r} names a key that is not configured: set "
            f"{prefix}{key_id} (configured: {', '.join(sorted(keys)) or 'none'})"]

