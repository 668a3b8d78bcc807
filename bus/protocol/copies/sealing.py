"""Sealing copies (encrypt the payload, then sign) and checking them on receipt.

A sender seals each copy when its envelope is created (``Addressing``), before it is stored in
an outbox record or the send ledger, and signs it again only when the copy gets a new attempt
id (``resign``). A receiver (admission, the Spark reader) ``check``s the signature right after
decoding, before anything else reads or writes on the copy's behalf, and ``open``s the payload
once it has the bytes (claim-check digest, decryption). Each failure is a poison reason.
"""

from __future__ import annotations

import base64
import hmac

from bus.encryption import Encryption, associated_data, decrypt, encrypt
from bus.envelope import BadSignal, Envelope, PayloadEncryption, Signature
from bus.signing import Signing, canonical, mac, payload_digest


class Tampered(BadSignal):
    """A signed copy whose claim-check blob is not the payload that was signed: the blob was
    written over, so the copy is not authentic as read - poisoned with its token left alone,
    as a copy whose signature does not hold."""


class Sealer:
    """The signing and encryption of one Bus (both off by default)."""

    def __init__(self, signing: Signing | None = None,
                 encryption: Encryption | None = None) -> None:
        self.signing = signing or Signing()
        self.encryption = encryption or Encryption()

    def seal(self, envelope: Envelope) -> Envelope:
        """A new copy, encrypted (when an encryption key is set) and signed (when on)."""
        key_id = self.encryption.key_id
        if key_id is not None:
            key = self.encryption.key(key_id)
            assert key is not None
            nonce, ciphertext = encrypt(key.secret, envelope.inline_payload(), associated_data(
                envelope.message_id, envelope.message_type, envelope.destination, key_id))
            envelope = envelope.model_copy(update={
                "bus": 2, "payload": base64.b64encode(ciphertext).decode("ascii"),
                "payload_encoding": "base64",
                "encryption": PayloadEncryption(key_id=key_id, nonce=nonce)})
        return self.resign(envelope)

    def resign(self, envelope: Envelope) -> Envelope:
        """The copy signed anew (it got a new attempt id); unsigned when signing is off."""
        if not self.signing.on:
            return envelope if envelope.signature is None else envelope.model_copy(
                update={"signature": None})
        key = self.signing.signer()
        digest = _digest(envelope)
        assert digest is not None
        signature = mac(key.secret, canonical(envelope, digest, key.key_id))
        return envelope.model_copy(
            update={"signature": Signature(key_id=key.key_id, hmac=signature)})

    def check(self, envelope: Envelope) -> str | None:
        """Why the copy's signature does not hold (a poison reason), or None when it does -
        or when signing is off, or it is unsigned and signing is ``sign-only``."""
        if not self.signing.on:
            return None
        signature = envelope.signature
        if signature is None:
            return "unsigned message" if self.signing.mode == "required" else None
        key = self.signing.key(signature.key_id)
        if key is None:
            return f"unknown signing key id {signature.key_id!r}"
        digest = _digest(envelope)
        if digest is None:
            return "bad signature: a signed payload in a blob needs payload_sha256"
        try:
            expected = mac(key.secret, canonical(envelope, digest, key.key_id))
        except (OverflowError, ValueError) as exc:  # a time with no UTC form
            return f"bad signature: the envelope cannot be put in canonical form ({exc})"
        if not hmac.compare_digest(expected.encode(), signature.hmac.encode("utf-8")):
            return f"bad signature (key {key.key_id!r})"
        if not key.allows(envelope.source):
            return f"source {envelope.source!r} not allowed for key {key.key_id!r}"
        return None

    def open(self, envelope: Envelope, data: bytes) -> bytes:
        """The message bytes of a copy ``check`` accepted, from its payload bytes ``data``
        (inline or read from its claim check): its blob checked against the signed digest,
        then decrypted. BadSignal with the reason when it cannot be."""
        if (self.signing.on and envelope.signature is not None
                and envelope.payload_ref is not None
                and payload_digest(data) != envelope.payload_sha256):
            raise Tampered("payload digest mismatch: the claim-check blob is not the payload "
                           "that was signed")
        encryption = envelope.encryption
        if encryption is None:
            return data
        key = self.encryption.key(encryption.key_id)
        if key is None:
            raise BadSignal(f"unknown encryption key id {encryption.key_id!r}")
        plain = decrypt(key.secret, encryption.nonce, data, associated_data(
            envelope.message_id, envelope.message_type, envelope.destination, key.key_id))
        if plain is None:
            raise BadSignal(f"payload cannot be decrypted with key {key.key_id!r}: another key "
                            "encrypted it, or it was altered or moved from another message")
        return plain


def _digest(envelope: Envelope) -> str | None:
    """The payload digest the canonical form carries: computed from an inline payload, taken
    from ``payload_sha256`` for one in a blob (None: missing)."""
    if envelope.payload_ref is None:
        return payload_digest(envelope.inline_payload())
    return envelope.payload_sha256
