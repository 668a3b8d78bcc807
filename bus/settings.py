"""Tunable settings, with the defaults a production endpoint should start from, and the one
reader of them from app settings (``Settings.from_environment``)."""

from __future__ import annotations

import os
import types
import typing
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from bus.encryption import Encryption, encryption_from_settings
from bus.errors import ConfigurationError
from bus.signing import Signing, signing_from_settings

SETTING_PREFIX = "BUS_"
"""Each field ``name`` of ``Settings`` is the app setting ``BUS_<NAME>`` (``lease_seconds``:
``BUS_LEASE_SECONDS``), but ``signing`` and ``encryption``, which have settings of their own
(docs/signing.md)."""

OWN_SETTINGS = ("signing", "encryption")
"""Fields read from settings of their own, not ``BUS_<NAME>``."""

NONE_WORDS = ("off", "none")
"""What a setting says to mean None, for a field that may be None."""


def setting_name(field: str) -> str:
    """The app setting of a ``Settings`` field: ``BUS_`` and its name in capitals."""
    return SETTING_PREFIX + field.upper()


MAX_TOKEN_SHARDS = 8
"""The most partitions an endpoint's tokens may spread over (attempt ids name one of them)."""


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    max_delivery_count: int = Field(5, ge=1)
    """Deliveries of a signal whose handler raises before it goes to the poison queue
    (the Functions host's maxDequeueCount default)."""
    crash_retry_delays: tuple[Annotated[float, Field(ge=0, le=7 * 24 * 3600)], ...] = (
        60.0, 600.0)
    """Automatic retries of a message the Functions host moved to the poison queue itself -
    its last delivery never ended: the instance crashed, stopped or timed out, since the
    bus poisons a handler's last failure itself, with the reason - and the wait before each
    (seconds from its adoption by maintenance; ``bus.protocol.poison.poisoned``). Each is
    audited; after the last the message stays in the poison queue, marked as a crash, for an
    operator. ``()`` (the setting ``off``): none."""
    lease_seconds: float = Field(600.0, gt=0)
    """How long a worker leases a queue message (the Functions host leases for 10 minutes and
    renews at half-time)."""
    ghost_horizon_seconds: float = Field(3600.0, gt=0)
    """How long a delayed storage request may still take effect; fences are kept this long."""
    orphan_age_seconds: float = Field(7 * 24 * 3600.0, gt=0)
    """Age at which a live token that nobody processed is reported and removed."""
    pending_age_seconds: float = Field(300.0, gt=0)
    """A pending outgoing token this old is checked against its origin's outbox slot by the
    sweeper, and removed if no committed record lists it (a handler run that never committed).
    Safety does not depend on it (the sweeper fences the slot first); it only keeps the
    sweeper away from records still being committed."""
    signal_bundles: bool = True
    """Send the signals a worker has for one queue at the same moment in one queue message
    (``bus.protocol.copies.bundles``; docs/envelope.md, "Bundles"). Every receiver of this package
    takes bundles apart; turn it off only for queues read by a consumer of your own that
    does not."""
    group_sends: bool = True
    """Concurrent ``send``/``publish`` calls of one ``Bus`` share their requests: the tokens of
    everything waiting in one transaction per destination, the signals in one bundle
    (``bus.protocol.send.group``). A lone sender never waits. Off: two requests per copy."""
    slot_cache_size: int = Field(1024, ge=0)
    """Outbox slots (state partitions) each endpoint's receiver remembers from its own commits,
    so the next message of a partition is claimed without reading the slot again
    (``bus.protocol.receive.slotcache``; 0 turns it off). The commit's compare-and-swap still
    decides."""
    round_concurrency: int = Field(8, ge=1)
    """Storage requests of one claim round a worker makes at once: its slot loads, its commits
    and its acknowledgements touch different partitions and messages, so they go side by side
    (``bus.protocol.receive.lanes``) instead of one round trip after another. 1 makes them one
    at a time."""
    token_shards: int = Field(4, ge=1, le=MAX_TOKEN_SHARDS)
    """Table partitions an endpoint's inbox tokens spread over (``bus.protocol.tokens.
    shards``): Azure serves a partition about 2,000 entities a second and a message draws about
    four on its token's, so each shard carries about 500 messages a second of one endpoint.
    Changing it is safe at any time (each attempt id names its shard); 1 is the layout of
    versions before shards."""
    release_resend_seconds: float = Field(300.0, gt=0)
    """A released deferral, a replayed poisoned message or a crashed message retried
    automatically still unprocessed this long after it was due gets its signal sent again by
    the sweeper (the release, the replay or the retry may have stopped between making its
    token live and sending)."""
    ledger_retention_seconds: float = Field(7 * 24 * 3600.0, gt=0)
    """How long ``Bus.send_once`` remembers a message id (its duplicate-detection window)."""
    send_attempts: int = Field(5, ge=1)
    """Tries per storage call of a send from outside a handler before it raises."""
    max_in_flight_sends: int = Field(32, ge=1)
    """Storage calls that put messages on their way (tokens, payloads, signals) at once per
    ``Bus``, across all threads; more wait their turn (a semaphore)."""
    depth_check_seconds: float = Field(1.0, ge=0)
    """How long a bounded queue's depth is trusted before it is read again
    (``bus.protocol.copies.backpressure``)."""
    max_payload_bytes: int = Field(64 * 1024 * 1024, ge=1)
    """The largest claim-check payload a send writes and a receiver reads: a larger send raises
    PayloadError, a larger blob is poisoned unread (the reader holds at most this much)."""
    peek_lease_seconds: float = Field(60.0, gt=0)
    """How long the poison-queue tools (and maintenance's adoption) lease the poison-queue
    entries they read: one they stop on comes back after this long."""
    stats_flush_seconds: float | None = Field(15.0, gt=0)
    """How often a host writes its endpoints' per-minute statistics (throughput, processing
    time, failures: ``bus.observability.stats``, for the dashboard): one row write per endpoint
    per process at most this often. None: not kept."""
    heartbeat_seconds: float | None = Field(10.0, gt=0)
    """How often each process serving endpoints (a Functions instance, a polling worker, a
    Spark stream) writes its heartbeat: one upsert per process (``bus.observability.heartbeat``).
    ``python -m bus status`` and the dashboard call it live while its last beat is at most
    1.5 intervals old. None: no heartbeats (and every endpoint shows no live instance)."""
    alert_critical_seconds: float | None = Field(600.0, gt=0)
    """Maintenance raises the ``critical_time`` alert of an endpoint whose oldest waiting
    message has waited longer (``bus.hosting.alerts``). None: not checked."""
    alert_queue_depth: int | None = Field(10_000, ge=1)
    """Maintenance raises the ``queue_depth`` alert of an endpoint whose queue holds more
    messages. None: not checked."""
    alert_webhook: str | None = Field(None, pattern=r"^https?://\S+$", repr=False)
    """Where maintenance POSTs (JSON) each alert that starts or stops to hold - a Teams, Slack
    or incident tool's incoming webhook; the URL is a secret (never logged). None: metrics and
    logs only."""
    stats_retention_days: int = Field(7, ge=1)
    """Days of per-minute statistics maintenance keeps."""
    queue_depth_seconds: float = Field(60.0, gt=0)
    """How often a host reads its queues' lengths for the ``eobus.queue.depth`` metric (one
    request per queue; between reads the last one is reported)."""
    process_span_parent: Literal["invocation", "message"] = "invocation"
    """The parent of each signal's ``process`` span (``bus.observability``). ``invocation``:
    the span current where the signal is received - a Functions invocation's - linked to the
    span that created the message (OpenTelemetry's messaging conventions' default); a host
    with no current span (the polling worker) parents it on the creation span. ``message``:
    always the creation span, linked to the invocation: one trace from a client's send to the
    last handler, in Application Insights' end-to-end view too."""
    client_name: str = "client"
    """The ``source`` of messages sent from outside any handler."""
    signing: Signing = Field(default_factory=Signing)
    """Signed messages: keys, the signing key, the mode (docs/signing.md; off by default)."""
    encryption: Encryption = Field(default_factory=Encryption)
    """Encrypted payloads: keys and the encrypting key (docs/signing.md; off by default)."""

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None, *,
                         base: Settings | None = None, source: str = "the environment",
                         ) -> Settings:
        """``base`` (default ``Settings()``) with every field whose app setting is set in
        ``environ`` (default ``os.environ``) taken from it: ``BUS_<NAME>`` per field
        (docs/configuration.md), signing and encryption from theirs (docs/signing.md).

        The one reader of the bus's app settings: the Functions app, the local host, the
        command line and the dashboard all come here. Every problem is reported at once, each
        naming its setting and ``source`` (where the settings were read).
        """
        problems: list[str] = []
        settings = cls.read(os.environ if environ is None else environ, problems, base=base)
        if problems:
            raise ConfigurationError(f"the bus's settings in {source} are not valid:\n  - "
                                     + "\n  - ".join(problems))
        return settings

    @classmethod
    def read(cls, environ: Mapping[str, str], problems: list[str], *,
             base: Settings | None = None) -> Settings:
        """``from_environment`` that appends its problems to ``problems`` (to be reported with
        others) and leaves a field it cannot read as ``base`` has it."""
        update: dict[str, Any] = {}
        for name, field in cls.model_fields.items():
            raw = environ.get(setting_name(name), "").strip()
            if name in OWN_SETTINGS or not raw:
                continue
            if raw.lower() in NONE_WORDS and _may_be_none(field.annotation):
                update[name] = None
                continue
            value: Any = raw
            if typing.get_origin(field.annotation) is tuple:  # a list: "60,600", or "off"
                value = [] if raw.lower() in NONE_WORDS else [
                    item.strip() for item in raw.split(",")]
            try:
                update[name] = getattr(cls.model_validate({name: value}), name)
            except ValidationError as exc:
                reason = "; ".join(error["msg"] for error in exc.errors())
                problems.append(f"{setting_name(name)}={raw!r} is invalid: {reason}")
        signing = signing_from_settings(environ, problems)
        if signing.on:
            update["signing"] = signing
        encryption = encryption_from_settings(environ, problems)
        if encryption.keys:
            update["encryption"] = encryption
        return (base or cls()).model_copy(update=update)


def _may_be_none(annotation: object) -> bool:
    return (typing.get_origin(annotation) in (typing.Union, types.UnionType)
            and type(None) in typing.get_args(annotation))
