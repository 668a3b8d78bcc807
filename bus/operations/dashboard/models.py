"""The JSON API's request and response bodies (pydantic: FastAPI validates requests against
them and describes them in the OpenAPI document at ``/api/openapi.json``).

Times are epoch seconds (floats, UTC) throughout, as the bus keeps them; the pages format them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


class Problem(BaseModel):
    """An error: what went wrong and what to do about it."""

    detail: str


class Settings(BaseModel):
    allow_actions: bool
    """Whether POST routes act (``--allow-actions``); when false they answer 403."""
    depth_seconds: float
    """Storage is read at most once per this many seconds per queue, for all viewers."""
    endpoints: list[str]
    prefix: str
    how_to_allow: str
    """What to run to allow actions."""


class PauseInfo(BaseModel):
    until: float
    reason: str


class Percentiles(BaseModel):
    p50: float | None
    p95: float | None
    p99: float | None


class TypeStats(BaseModel):
    message_type: str
    processed: int
    failed: int
    poisoned: int
    processing_ms: Percentiles
    critical_seconds: Percentiles


class Stats(BaseModel):
    """Throughput and processing time over the period (the data layer's ``EndpointStats``)."""

    processed: int
    failed: int
    poisoned: int
    other: int = 0
    """Signals with another outcome (duplicates, deferrals, ...)."""
    seconds: float
    mean_ms: float | None
    max_ms: float | None
    per_minute: list[tuple[float, int]]
    """(minute start, messages processed in it)."""
    processing_ms: Percentiles | None = None
    """Processing time of a signal (decoding to outcome), ms: p50, p95, p99."""
    critical_seconds: Percentiles | None = None
    """Critical time of a processed message (due to processed), s: p50, p95, p99."""
    critical_per_minute: list[tuple[float, float]] = Field(default_factory=list)
    """(minute start, its p95 critical time)."""
    depth: list[tuple[float, int]] = Field(default_factory=list)
    """(minute start, the queue's length), as maintenance found it."""
    drain_seconds: float | None = None
    """Estimated time to drain the queue (0: empty; None: not falling, or unknown)."""
    per_type: list[TypeStats] = Field(default_factory=list)
    """Per message type, busiest first."""


class EndpointRow(BaseModel):
    name: str
    queue: str
    depth: int | None
    """Approximate messages in the queue (Get Queue Metadata), None when the read failed."""
    oldest_age_seconds: float | None
    """How long the message at the front of the queue has been on it (a peek; queues are
    roughly first in, first out, so approximate); None when the queue shows none."""
    poison: int | None
    paused: PauseInfo | None
    deferred: int | None
    scheduled: int | None
    stats: Stats | None
    read_at: float
    """When the oldest of the cached readings shown here was taken."""
    live: list[str] | None = None
    """The ids of the live instances serving it (their heartbeats); None when unread."""
    unserved: bool = False
    """Messages wait in its queue and no live instance serves it."""
    errors: dict[str, str] = Field(default_factory=dict)
    """Readings that failed, by field: their error."""


class InstanceItem(BaseModel):
    """A process serving endpoints, as its last heartbeat says (``bus.observability.heartbeat``)."""

    id: str
    kind: str
    """``functions``, ``worker`` or ``spark``."""
    host: str
    pid: int
    version: str
    endpoints: list[str]
    started_at: float
    last_seen: float
    every: float
    """Its heartbeat interval (seconds)."""
    stopped: bool
    live: bool
    """Not stopped, and last seen at most 1.5 intervals ago."""


class Instances(BaseModel):
    now: float
    instances: list[InstanceItem]
    """Most recently seen first."""


class Endpoints(BaseModel):
    now: float
    period: float
    endpoints: list[EndpointRow]


class PauseRequest(BaseModel):
    seconds: float = Field(gt=0, le=30 * 24 * 3600, description="How long to pause, seconds.")
    reason: str = Field("", max_length=500)


class PauseResult(BaseModel):
    endpoint: str
    paused: PauseInfo | None


class PoisonedEntry(BaseModel):
    id: str
    message_id: str | None
    poisoned_at: float
    reason: str
    token: str
    """The message's inbox token: ``poisoned``, ``live``, ... or ``gone`` (processed or purged)."""
    replayable: bool
    crashed: bool = False
    """Moved here by the Functions host: its last delivery never ended (a crash), no handler
    failed - shown apart from failures."""
    retries: int = 0
    """The automatic retries it had after crashes (``Settings.crash_retry_delays``)."""


class PoisonedGroup(BaseModel):
    endpoint: str
    message_type: str | None
    exception_type: str | None
    count: int
    first_seen: float
    last_seen: float
    ids: list[str]
    entries: list[PoisonedEntry]


class Poisoned(BaseModel):
    groups: list[PoisonedGroup]
    errors: dict[str, str] = Field(default_factory=dict)
    """Endpoints whose poison queue could not be read: the error."""


class PoisonedDetail(BaseModel):
    endpoint: str
    id: str
    reason: str
    exception: str | None
    exception_type: str | None
    dequeue_count: int
    poisoned_at: float
    token: str
    replayable: bool
    envelope: dict[str, Any] | None
    headers: dict[str, str]
    payload_text: str | None
    """The message's payload as text (JSON, UTF-8): inline, or read from its claim-check blob;
    None when encrypted, base64 or unavailable (``payload_note`` says which)."""
    payload_note: str | None
    original_body: str


class Selection(BaseModel):
    """Which entries to act on. ``count`` must equal the number of ids: the page sends the
    number its confirmation named, so it cannot act on more than the operator confirmed."""

    ids: list[str] = Field(min_length=1, max_length=10_000)
    count: int


class ReplaySelection(Selection):
    drop_expiry: bool = False
    """Send the messages without their time-to-live (see ``python -m bus dlq replay``)."""


class ReplayResult(BaseModel):
    results: dict[str, str]
    """Entry id -> replayed, resent, stale, not a message, mismatched, unverified."""
    replayed: int
    missing: list[str]
    """Ids not found in the poison queue (replayed or purged meanwhile, or held by another
    reader: ``Settings.peek_lease_seconds``)."""


class PurgeResult(BaseModel):
    purged: list[str]
    missing: list[str]
    kept: dict[str, str] = {}
    """Entries kept, with why: a message whose handler committed keeps its entry until its
    record's sends can go out (``bus.protocol.receive.settle``)."""


class DeferredItem(BaseModel):
    endpoint: str
    message_id: str
    message_type: str
    since: float
    deferrals: int
    correlation_id: str


class ReleaseRequest(BaseModel):
    deferrals: int | None = None
    """Release only the deferral seen (its ``deferrals``), not a later one."""


class AuditItem(BaseModel):
    """One operator action of the audit trail (``bus.audit``)."""

    at: float
    who: str
    action: str
    endpoint: str
    target: dict[str, Any]


class ReleaseResult(BaseModel):
    endpoint: str
    message_id: str
    released: bool


class SessionItem(BaseModel):
    endpoint: str
    session: str
    partition: str
    status: Literal["stuck", "waiting", "open", "closed"]
    next: dict[str, int]
    waiting: int
    waited_seconds: float
    first_waiting: dict[str, int]
    handled: int
    gaps: int
    blocked_since: float | None
    closed_at: float | None
    blocked_by: list[str] = []
    """Poison entries at the endpoint holding the session's gap: the copies it needs next."""


class SessionResult(BaseModel):
    endpoint: str
    session: str
    released: int
    """Waiting messages released (past the gap, or to the poison queue on close)."""


class ScheduledItem(BaseModel):
    endpoint: str
    message_id: str
    attempt_id: str
    due_at: float
    message_type: str | None


class ConversationMessage(BaseModel):
    message_id: str
    message_type: str | None
    source: str | None
    destination: str | None
    causation_id: str | None
    state: Literal["queued", "scheduled", "deferred", "poisoned", "processed", "unknown"]
    since: float | None
    attempt_id: str | None


class Conversation(BaseModel):
    id: str
    correlation_id: str | None
    messages: list[ConversationMessage]
