"""Encrypted payloads: AES-256-GCM (the ``cryptography`` package), with key ids and rotation.

Documented in docs/signing.md. Only the payload is encrypted (inline, or in its claim-check
blob); the envelope's other fields - message type, ids, source, headers - stay readable, as
routing and deduplication need them. Each copy gets its own random 96-bit nonce; the associated
data binds the ciphertext to its message id, message type and destination, so it cannot be
moved into another message. Payloads are encrypted first, then signed: the signature covers
the ciphertext.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Mapping

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from pydantic import BaseModel, ConfigDict, Field, model_validator

from bus.signing import KEY_ID_PATTERN, settings_keys, unknown_key

KEY_BYTES = 32
"""AES-256: keys of exactly 32 bytes."""
NONCE_BYTES = 12


class EncryptionKey(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    key_id: str = Field(pattern=KEY_ID_PATTERN)
    secret: bytes = Field(min_length=KEY_BYTES, max_length=KEY_BYTES, repr=False)


class Encryption(BaseModel):
    """The keys that decrypt, and the one that encrypts new payloads (``key_id``; None: new
    payloads go unencrypted, encrypted ones received are still decrypted)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    keys: tuple[EncryptionKey, ...] = ()
    key_id: str | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Encryption:
        ids = [key.key_id for key in self.keys]
        if len(set(ids)) != len(ids):
            raise ValueError(f"encryption key ids must be unique: {', '.join(ids)}")
        if self.key_id is not None and self.key_id not in ids:
            raise ValueError(f"the encryption key id {self.key_id!r} is not one of the keys "
                             f"configured ({', '.join(ids) or 'none'})")
        return self

    def key(self, key_id: str) -> EncryptionKey | None:
        return next((key for key in self.keys if key.key_id == key_id), None)


def associated_data(message_id: str, message_type: str, destination: str,
                    key_id: str) -> bytes:
    """What AES-GCM authenticates besides the ciphertext (docs/envelope.md, "Encryption")."""
    return json.dumps({"destination": destination, "key_id": key_id,
                       "message_id": message_id, "message_type": message_type},
                      sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def encrypt(secret: bytes, plaintext: bytes, aad: bytes) -> tuple[str, bytes]:
    """A fresh random nonce (base64) and the ciphertext with its 16-byte tag."""
    nonce = os.urandom(NONCE_BYTES)
    return base64.b64encode(nonce).decode("ascii"), AESGCM(secret).encrypt(nonce, plaintext, aad)


def decrypt(secret: bytes, nonce: str, ciphertext: bytes, aad: bytes) -> bytes | None:
    """The plaintext, or None when it cannot be decrypted (wrong key, altered ciphertext or
    associated data, a malformed nonce)."""
    try:
        raw_nonce = base64.b64decode(nonce, validate=True)
    except (binascii.Error, ValueError):
        return None
    if len(raw_nonce) != NONCE_BYTES:
        return None
    try:
        return AESGCM(secret).decrypt(raw_nonce, ciphertext, aad)
    except InvalidTag:
        return None


def encryption_from_settings(env: Mapping[str, str], problems: list[str]) -> Encryption:
    """``Encryption`` from app settings: ``BUS_ENCRYPTION_KEY_ID`` and one
    ``BUS_ENCRYPTION_KEY__<id>`` per key (base64 of 32 bytes; each may be a Key Vault
    reference). Problems appended to ``problems``; the result is then ``Encryption()``."""
    secrets = settings_keys(env, "BUS_ENCRYPTION_KEY__", KEY_BYTES, KEY_BYTES, problems)
    key_id = env.get("BUS_ENCRYPTION_KEY_ID", "").strip() or None
    found = unknown_key("BUS_ENCRYPTION_KEY_ID", key_id, secrets, "BUS_ENCRYPTION_KEY__")
    problems.extend(found)
    if found:
        return Encryption()
    return Encryption(keys=tuple(EncryptionKey(key_id=k, secret=s) for k, s in secrets.items()),
                      key_id=key_id)
