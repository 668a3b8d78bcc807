"""The envelope: the JSON document a signal carries. Documented in docs/envelope.md.

On the queue, a signal body is the envelope as UTF-8 JSON, base64-encoded (what the Azure
Functions queue trigger expects). When the encoded envelope would not fit a queue message, the
payload moves to a blob (claim check) and the envelope carries ``payload_ref`` instead.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from bus.errors import UnreadableVersion
from bus.versions import ENVELOPE

ID_PATTERN = r"^[A-Za-z0-9_-]{1,128}$"
NAME_CHARS = 256
"""The longest ``source``, ``destination``, ``topic``, ``correlation_id``, ``causation_id`` and
``content_type`` (each is copied into every message a handler sends: a long one would make
them too large for a queue message)."""
STREAM_CHARS = 1_024
"""The longest ``stream``: an endpoint name and a partition key (at most 1 KiB as a key)."""
MAX_HEADERS = 32
HEADER_NAME_CHARS = 128
HEADER_VALUE_CHARS = 1_024


class BadSignal(ValueError):
    """A signal the endpoint cannot process; the message says why (the poison reason)."""


class PayloadRef(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    container: str
    blob: str


class Signature(BaseModel):
    """A copy's signature (``bus.signing``): the key's id and the HMAC-SHA256, base64."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    key_id: str = Field(max_length=64)
    hmac: str = Field(max_length=64)


class PayloadEncryption(BaseModel):
    """How an encrypted payload was encrypted (``bus.encryption``): the key's id and the
    copy's nonce, base64. Its envelope is version 2."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    key_id: str = Field(max_length=64)
    nonce: str = Field(max_length=64)


class Envelope(BaseModel):
    """Everything a receiver needs to deduplicate, route and deserialize one message copy."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    bus: Literal[1, 2] = 1
    """The envelope's version (``bus.versions``): 2 when its payload is encrypted (a reader of
    version 1 only would misread it), 1 otherwise - set from the content, whatever a document
    says; newer ones are poisoned with the reason."""
    message_id: str = Field(pattern=ID_PATTERN)
    attempt_id: str = Field(pattern=ID_PATTERN)
    kind: Literal["command", "event"]
    message_type: str = Field(min_length=1, max_length=256)
    source: str = Field(max_length=NAME_CHARS)
    destination: str = Field(max_length=NAME_CHARS)
    topic: str | None = Field(None, max_length=NAME_CHARS)
    correlation_id: str = Field(max_length=NAME_CHARS)
    causation_id: str | None = Field(None, max_length=NAME_CHARS)
    headers: dict[str, str] = Field(default_factory=dict, max_length=MAX_HEADERS)
    sent_at: datetime
    content_type: str = Field("application/json", max_length=NAME_CHARS)
    payload: str | None = None
    payload_encoding: Literal["utf-8", "base64"] = "utf-8"
    payload_ref: PayloadRef | None = None
    not_before: datetime | None = None
    """Scheduled delivery: the receiver does not process the message before this time (it
    puts the signal back with the remaining delay)."""
    expires_at: datetime | None = None
    """Time-to-live: a copy that arrives after this time is not processed, it is poisoned
    with a reason starting ``expired`` (``bus.protocol.receive.admission``). It counts from when the
    message is due: ``sent_at`` + delay + ttl. A time without a zone is taken as UTC."""
    encryption: PayloadEncryption | None = None
    """Set when ``payload`` is the AES-GCM ciphertext of the message (base64)."""
    payload_sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")
    """On a signed copy whose payload is in a blob: the blob's SHA-256 (hex), which the
    signature covers; checked once the blob is read."""
    signature: Signature | None = None
    """HMAC-SHA256 of the copy's canonical form (``bus.signing``)."""
    session: str | None = Field(None, min_length=1, max_length=NAME_CHARS)
    """The session the copy belongs to at its destination (``bus.protocol.sessions.order``)."""
    stream: str | None = Field(None, min_length=1, max_length=STREAM_CHARS)
    """Who numbered it: the sending endpoint and partition, or ``client:<name>``."""
    sequence: int | None = Field(None, ge=1, le=2**62)
    """Its number in ``stream`` for this destination and session: 1, 2, 3, ..."""

    @model_validator(mode="before")
    @classmethod
    def _version(cls, document: object) -> object:
        """The version follows the content: 2 exactly when the payload is encrypted."""
        if isinstance(document, dict):
            encrypted = document.get("encryption") is not None
            return {**document, "bus": 2 if encrypted else 1}
        return document

    @field_validator("sent_at", "not_before", "expires_at")
    @classmethod
    def _utc(cls, moment: datetime | None) -> datetime | None:
        """Every time in UTC (one without a zone is taken as UTC, as the signature's canonical
        form takes it), and one that has a timestamp: a time whose UTC form falls outside
        years 1-9999 is refused here rather than raising wherever it is read."""
        if moment is None:
            return None
        try:
            if moment.tzinfo is None:
                moment = moment.replace(tzinfo=timezone.utc)
            moment.timestamp()
            return moment.astimezone(timezone.utc)
        except (OverflowError, ValueError) as exc:
            raise ValueError(f"{moment.isoformat()} has no UTC form (years 1-9999)") from exc

    @model_validator(mode="after")
    def _one_payload(self) -> Envelope:
        if (self.payload is None) == (self.payload_ref is None):
            raise ValueError("exactly one of payload and payload_ref must be set")
        if self.payload is not None and self.payload_encoding == "base64":
            try:
                base64.b64decode(self.payload, validate=True)
            except (binascii.Error, ValueError) as exc:
                raise ValueError(f"payload is not valid base64: {exc}") from exc
        if (self.sequence is None) != (self.stream is None) or (
                self.sequence is not None and self.session is None):
            raise ValueError("stream and sequence come together, and only with a session")
        for name, value in self.headers.items():
            if len(name) > HEADER_NAME_CHARS or len(value) > HEADER_VALUE_CHARS:
                raise ValueError(f"header {name[:40]!r}: names take at most "
                                 f"{HEADER_NAME_CHARS} characters, values "
                                 f"{HEADER_VALUE_CHARS}")
        return self

    def inline_payload(self) -> bytes:
        """The payload bytes of an envelope that carries its payload inline."""
        if self.payload is None:
            raise ValueError("the payload is in a blob (payload_ref)")
        if self.payload_encoding == "base64":
            return base64.b64decode(self.payload)
        return self.payload.encode("utf-8")

    def to_json(self) -> str:
        return self.model_dump_json(exclude_none=True)


def payload_text(data: bytes, text: bool) -> tuple[str, Literal["utf-8", "base64"]]:
    """How payload bytes are carried inside the JSON envelope."""
    if text:
        return data.decode("utf-8"), "utf-8"
    return base64.b64encode(data).decode("ascii"), "base64"


def fits_signal(envelope: Envelope, capacity: int) -> bool:
    """Whether the envelope, as JSON, is at most ``capacity`` bytes: what a queue message
    carries once base64-encoded (``StorageLimits.signal_bytes``)."""
    return len(envelope.to_json().encode("utf-8")) <= capacity


def encode_signal(envelope: Envelope) -> str:
    """The queue body of a signal (the queue refuses one over its limit: ``fits_signal``)."""
    return base64.b64encode(envelope.to_json().encode("utf-8")).decode("ascii")


MAX_BUNDLE_PARTS = 32
"""Signals one bundle carries at most (what one receive leases at most): a bundle of more is
poisoned whole, never split into thousands of entries."""
_BUNDLE_HEAD = '{"bus":1,"bundle":['
_BUNDLE_TAIL = "]}"
BUNDLE_OVERHEAD = len(_BUNDLE_HEAD) + len(_BUNDLE_TAIL)
"""Bytes a bundle adds around its signals (plus one comma between two of them)."""


def encode_bundle(signals: Sequence[str]) -> str:
    """One queue message body carrying several signals: ``signals`` are envelope JSON texts
    (as ``Envelope.to_json``), all for the same queue. See docs/envelope.md, "Bundles"."""
    raw = (_BUNDLE_HEAD + ",".join(signals) + _BUNDLE_TAIL).encode("utf-8")
    return base64.b64encode(raw).decode("ascii")


def split_bundle(body: str) -> list[str] | None:
    """The signal bodies a bundle carries (each as it would sit on the queue alone), or None
    when ``body`` is not a bundle (a plain signal, or garbage: decoding it says why)."""
    try:
        raw = base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        return None
    signals = bundle_parts(raw)
    if signals is None:
        return None
    return [base64.b64encode(signal).decode("ascii") for signal in signals]


def bundle_parts(raw: bytes) -> list[bytes] | None:
    """``split_bundle`` for a body already base64-decoded: each signal's envelope JSON, or
    None when ``raw`` is not a bundle."""
    if not raw.startswith(_BUNDLE_HEAD.encode()):
        return None
    try:
        text = raw.decode("utf-8")
        document = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(document, dict) or set(document) - {"bus", "bundle", DELIVERIES}:
        return None  # a bundle has no other key: the host would read it (``HOST_METADATA``)
    signals = document.get("bundle")
    if not isinstance(signals, list) or not 0 < len(signals) <= MAX_BUNDLE_PARTS or not all(
            isinstance(signal, dict) for signal in signals):
        return None  # decoding it as an envelope says why it cannot be processed
    spans = _element_spans(text, len(_BUNDLE_HEAD), len(signals))
    if spans is None or [json.loads(span) for span in spans] != signals:
        return None  # e.g. a second "bundle" key: not a bundle this bus wrote
    return [span.encode("utf-8") for span in spans]  # each part exactly as it was sent


def _element_spans(text: str, start: int, count: int) -> list[str] | None:
    """The texts of the first ``count`` elements of the JSON array whose first element starts
    at or after ``start`` (whitespace allowed), exactly as written; None if they are not."""
    decoder = json.JSONDecoder()
    spans: list[str] = []
    index = start
    while len(spans) < count:
        while index < len(text) and text[index] in " \t\r\n":
            index += 1
        try:
            _, end = decoder.raw_decode(text, index)
        except (ValueError, RecursionError):
            return None
        spans.append(text[index:end])
        index = end
        while index < len(text) and text[index] in " \t\r\n":
            index += 1
        if index < len(text) and text[index] == ",":
            index += 1
    return spans


DELIVERIES = "deliveries"
"""The envelope field a copy put back on its queue carries: the deliveries the message had
before (docs/envelope.md). A receiver counts ``deliveries`` + the queue's dequeue count; one
that does not know the field ignores it, like any unknown field."""


def carried_deliveries(raw: bytes) -> tuple[bytes, int]:
    """A signal's envelope JSON (base64-decoded) without its ``deliveries`` field, and the
    count the field carried; ``raw`` itself and 0 when there is none (most signals: they are
    not parsed for it), or when ``raw`` is not a JSON object."""
    if b'"deliveries"' not in raw:
        return raw, 0
    document = _object(raw)
    if document is None or DELIVERIES not in document:
        return raw, 0
    count = document.pop(DELIVERIES)
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        count = 0
    bare = _dumps(document)
    return (raw, 0) if bare is None else (bare, count)


def with_deliveries(raw: bytes, deliveries: int, capacity: int) -> bytes | None:
    """The envelope JSON ``raw`` carrying ``deliveries`` (none when 0), or None when ``raw``
    is not a JSON object or the result would be over ``capacity`` bytes (``fits_signal``)."""
    document = _object(raw)
    if document is None:
        return None
    document.pop(DELIVERIES, None)
    annotated = _dumps({**document, DELIVERIES: deliveries} if deliveries > 0 else document)
    return annotated if annotated is not None and len(annotated) <= capacity else None


def _object(raw: bytes) -> dict[str, object] | None:
    """``raw`` as a JSON object, or None - whatever the bytes (not UTF-8, not JSON, an integer
    of thousands of digits, nesting deeper than the interpreter's recursion limit)."""
    try:
        document = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):
        return None
    return document if isinstance(document, dict) else None


def _dumps(document: dict[str, object]) -> bytes | None:
    """Compact JSON, or None when a string holds a lone surrogate (UTF-8 cannot carry it) or
    the nesting is too deep to write back."""
    try:
        return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    except (UnicodeEncodeError, RecursionError):
        return None


HOST_METADATA = frozenset({"queuetrigger", "dequeuecount", "expirationtime", "id",
                           "insertiontime", "nextvisibletime", "popreceipt"})
"""The queue trigger's metadata names (any case). The Functions host merges a JSON body's
top-level properties into the trigger's metadata, over its own: a body carrying one of
these names would set what the trigger reads - its dequeue count, say - from outside the
signature. No envelope or bundle this bus writes carries one, so such a body is refused."""


def decode_signal(body: str | bytes) -> Envelope:
    """Parse a signal body exactly as it sits on the queue (base64 text)."""
    try:
        raw = base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise BadSignal(f"body is not valid base64: {exc}") from exc
    return parse_envelope(raw)


def parse_envelope(raw: bytes) -> Envelope:
    """Parse the envelope JSON (already base64-decoded, as the Functions trigger hands it).

    Raises BadSignal, with the reason, for anything that is not an envelope this bus can
    process and send on - never another exception, whatever the bytes."""
    try:
        document = json.loads(raw.decode("utf-8"))
    except ValueError as exc:  # not UTF-8, not JSON, or an integer of thousands of digits
        raise BadSignal(f"body is not UTF-8 JSON: {str(exc)[:200]}") from exc
    except RecursionError as exc:
        raise BadSignal("body is JSON nested too deeply") from exc
    if not isinstance(document, dict):
        raise BadSignal("body is JSON but not an object")
    taken = sorted(key for key in document if key.lower() in HOST_METADATA)
    if taken:
        raise BadSignal(f"body carries {taken[0][:40]!r}, a name the Functions host takes "
                        "for the queue message's own metadata: not an envelope this bus wrote")
    if "bundle" in document and "message_id" not in document:
        raise BadSignal(f"a bundle this bus does not take apart (at most {MAX_BUNDLE_PARTS} "
                        "parts, each an object)")
    try:
        envelope = Envelope.model_validate(ENVELOPE.read(document))
    except UnreadableVersion as exc:
        raise BadSignal(str(exc)) from exc
    except ValidationError as exc:
        raise BadSignal(f"envelope is invalid: {_summary(exc)}") from exc
    if b"\\u" in raw and not _encodable(envelope):
        raise BadSignal("envelope is invalid: a string holds a lone surrogate, which UTF-8 "
                        "cannot carry")
    return envelope


def _encodable(envelope: Envelope) -> bool:
    """Whether the envelope can be written again (JSON escapes can name lone surrogates)."""
    try:
        envelope.to_json().encode("utf-8")
    except ValueError:  # UnicodeEncodeError, PydanticSerializationError
        return False
    return True


def _summary(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or '(root)'}: {e['msg']}"
                     for e in exc.errors())
