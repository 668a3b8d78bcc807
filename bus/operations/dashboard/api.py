"""The JSON API under ``/api`` - what the pages fetch and what scripts and tests call.

Every route is typed (``bus.operations.dashboard.models``), so the OpenAPI document at
``/api/openapi.json`` (browsable at ``/api/docs``) describes each body. POST routes act on the
bus; the app refuses them all with 403 unless it was created with ``allow_actions=True`` (a
check in front of every route, ``bus.operations.dashboard.guard``, not in each one).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import time
from collections import defaultdict
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query

from bus.operations.dashboard import models
from bus.operations.dashboard.monitor import Monitor
from bus.protocol.poison.poisoned import EntryFilter, PoisonedMessage


def router(monitor: Monitor, settings: models.Settings) -> APIRouter:
    api = APIRouter(prefix="/api", responses={
        403: {"model": models.Problem, "description": "actions are not allowed"},
        404: {"model": models.Problem, "description": "no such endpoint, entry or session"}})

    @api.get("/settings", tags=["settings"])
    def get_settings() -> models.Settings:
        """Whether actions are allowed, the polling interval, the app's endpoints."""
        return settings

    _endpoint_routes(api, monitor)
    _poisoned_routes(api, monitor)
    _waiting_routes(api, monitor)
    return api


def _endpoint_routes(api: APIRouter, monitor: Monitor) -> None:
    @api.get("/endpoints", tags=["endpoints"])
    def endpoints(period: Annotated[float, Query(ge=60, le=7 * 24 * 3600,
                                                 description="seconds of statistics")] = 3600,
                  ) -> models.Endpoints:
        """Each endpoint's queue depth, poison count, pause, deferred and scheduled counts and
        its throughput over ``period`` - readings shared by all viewers, at most one per
        ``depth_seconds`` each."""
        rows = [_endpoint_row(monitor, name, period) for name in monitor.endpoints]
        return models.Endpoints(now=monitor.poller.now(), period=period, endpoints=rows)

    @api.get("/instances", tags=["endpoints"])
    def instances() -> models.Instances:
        """The processes serving endpoints (Functions instances, polling workers, Spark
        streams), from their heartbeats, most recently seen first; live or not."""
        reading = monitor.instances()
        if reading.value is None:
            raise HTTPException(503, f"the instances could not be read: {reading.error}")
        now = monitor.poller.now()
        return models.Instances(now=now, instances=[
            models.InstanceItem(**{**dataclasses.asdict(i), "endpoints": list(i.endpoints)},
                                live=i.live(now))
            for i in reading.value])

    @api.post("/endpoints/{endpoint}/pause", tags=["endpoints"])
    def pause(endpoint: str, request: models.PauseRequest) -> models.PauseResult:
        """Stop every worker of the endpoint from consuming for ``seconds`` (``bus.pause``)."""
        monitor.pause(monitor.check(endpoint), request.seconds, request.reason)
        return _pause_result(monitor, endpoint)

    @api.post("/endpoints/{endpoint}/resume", tags=["endpoints"])
    def resume(endpoint: str) -> models.PauseResult:
        """End the endpoint's pause (``bus.resume``)."""
        monitor.resume(monitor.check(endpoint))
        return _pause_result(monitor, endpoint)


def _poisoned_routes(api: APIRouter, monitor: Monitor) -> None:
    @api.get("/poisoned", tags=["poisoned"])
    def poisoned(*, endpoint: Annotated[str | None, Query(max_length=63)] = None,
                 message_type: Annotated[str | None, Query(max_length=256)] = None,
                 exception: Annotated[str | None, Query(max_length=256)] = None,
                 reason: Annotated[str | None, Query(max_length=256)] = None,
                 since: float | None = None, until: float | None = None) -> models.Poisoned:
        """Poison entries of every endpoint (or ``endpoint``'s) grouped by (endpoint, message
        type, exception type), largest group first; only those the filters match (message
        type exactly, text contained in the exception or reason, poisoned in
        [``since``, ``until``), epoch seconds)."""
        where = EntryFilter(message_type, exception, reason, since, until)
        groups: dict[tuple[str, str | None, str | None], list[PoisonedMessage]] = defaultdict(list)
        errors: dict[str, str] = {}
        for name in _chosen(monitor, endpoint):
            reading = monitor.poisoned(name)
            if reading.error is not None:
                errors[name] = reading.error
            for letter in reading.value or []:
                if not where.matches(letter):
                    continue
                envelope = letter.entry.envelope
                groups[(name, envelope.message_type if envelope else None,
                        _exception_type(letter.entry.exception))].append(letter)
        out = [models.PoisonedGroup(
            endpoint=endpoint, message_type=message_type, exception_type=exception_type,
            count=len(letters), first_seen=min(_seen(x) for x in letters),
            last_seen=max(_seen(x) for x in letters), ids=[x.id for x in letters],
            entries=[_entry(x) for x in letters])
            for (endpoint, message_type, exception_type), letters in groups.items()]
        out.sort(key=lambda g: (-g.count, g.endpoint, g.message_type or "",
                                g.exception_type or ""))
        return models.Poisoned(groups=out, errors=errors)

    @api.get("/poisoned/{endpoint}/{entry_id}", tags=["poisoned"])
    def poisoned_entry(endpoint: str, entry_id: str) -> models.PoisonedDetail:
        """One poison entry in full: envelope, headers, payload text, reason, exception,
        delivery count, the message's token."""
        monitor.check(endpoint)
        for letter in monitor.poisoned(endpoint).value or []:
            if letter.id == entry_id:
                return _detail(monitor, endpoint, letter)
        raise HTTPException(404, f"no entry {entry_id!r} in the poison queue of {endpoint!r} "
                                 "(replayed or purged since?)")

    @api.post("/poisoned/{endpoint}/replay", tags=["poisoned"])
    def replay(endpoint: str, selection: models.ReplaySelection) -> models.ReplayResult:
        """Replay the named entries exactly once, as ``python -m bus dlq replay`` does."""
        ids = _checked(selection)
        results = monitor.replay(monitor.check(endpoint), ids, selection.drop_expiry)
        return models.ReplayResult(
            results={k: v.value for k, v in results.items()},
            replayed=sum(v.value in ("replayed", "resent") for v in results.values()),
            missing=sorted(ids - set(results)))

    @api.post("/poisoned/{endpoint}/purge", tags=["poisoned"])
    def purge(endpoint: str, selection: models.Selection) -> models.PurgeResult:
        """Delete the named entries for good, with their poisoned tokens and payloads, as
        ``python -m bus dlq purge`` does."""
        ids = _checked(selection)
        purged, kept = monitor.purge(monitor.check(endpoint), ids)
        return models.PurgeResult(purged=purged, kept=kept,
                                  missing=sorted(ids - set(purged) - set(kept)))



def _waiting_routes(api: APIRouter, monitor: Monitor) -> None:
    @api.get("/deferred", tags=["waiting"])
    def deferred(endpoint: str | None = None) -> list[models.DeferredItem]:
        """Messages the handlers deferred, oldest first (a scan of each endpoint's tokens)."""
        return [models.DeferredItem(endpoint=d.endpoint, message_id=d.message_id,
                                    message_type=d.message_type, since=d.since,
                                    deferrals=d.deferrals,
                                    correlation_id=d.envelope.correlation_id)
                for name in _chosen(monitor, endpoint) for d in monitor.deferred(name)]

    @api.post("/deferred/{endpoint}/{message_id}/release", tags=["waiting"])
    def release(endpoint: str, message_id: str,
                request: models.ReleaseRequest | None = None) -> models.ReleaseResult:
        """Release a deferred message: it is processed once more by its handler."""
        released = monitor.release(monitor.check(endpoint), message_id,
                                   request.deferrals if request else None)
        return models.ReleaseResult(endpoint=endpoint, message_id=message_id,
                                    released=released)

    @api.get("/sessions", tags=["waiting"])
    def sessions(endpoint: str | None = None) -> list[models.SessionItem]:
        """Sessions of each endpoint, stuck ones (a gap held them up longer than the reorder
        window) first; ``blocked_by`` names the poison entries that hold a gap (the copy a
        waiting session needs next, poisoned: replay it, or skip the gap)."""
        out: list[models.SessionItem] = []
        for name in _chosen(monitor, endpoint):
            infos, now, window = monitor.sessions(name)
            summaries = [info.summary(now, window) for info in infos]
            letters = (monitor.poisoned(name).value or [] if any(
                s["status"] in ("stuck", "waiting") for s in summaries) else [])
            out += [models.SessionItem.model_validate(
                {**summary, "endpoint": name, "blocked_by": _blocking(letters, summary)})
                for summary in summaries]
        rank = {"stuck": 0, "waiting": 1, "open": 2, "closed": 3}
        out.sort(key=lambda s: (rank[s.status], -s.waited_seconds))
        return out

    @api.post("/sessions/{endpoint}/{session}/skip", tags=["waiting"])
    def skip(endpoint: str, session: str,
             partition: str | None = None) -> models.SessionResult:
        """Move the session past its gap now (recorded as the operator's). ``partition``:
        the session's, when its key has rows in several (409 without it)."""
        released = monitor.skip(monitor.check(endpoint), session, partition)
        return models.SessionResult(endpoint=endpoint, session=session, released=released)

    @api.post("/sessions/{endpoint}/{session}/close", tags=["waiting"])
    def close(endpoint: str, session: str,
              partition: str | None = None) -> models.SessionResult:
        """Close the session: its waiting and later messages go to the poison queue.
        ``partition``: as for skip."""
        released = monitor.close(monitor.check(endpoint), session, partition)
        return models.SessionResult(endpoint=endpoint, session=session, released=released)

    @api.get("/scheduled", tags=["waiting"])
    def scheduled(endpoint: str | None = None) -> list[models.ScheduledItem]:
        """Messages sent with a delay that are not due yet, soonest first."""
        items = [models.ScheduledItem.model_validate(_fields(s))
                 for name in _chosen(monitor, endpoint) for s in monitor.scheduled(name)]
        return sorted(items, key=lambda s: s.due_at)

    @api.get("/audit", tags=["audit"])
    def audit(limit: Annotated[int, Query(ge=1, le=1_000)] = 100) -> list[models.AuditItem]:
        """The latest operator actions of the last 30 days, newest first: who replayed,
        purged, paused, resumed, released, skipped or closed what, and when."""
        return [models.AuditItem(at=r.at, who=r.who, action=r.action, endpoint=r.endpoint,
                                 target=r.target) for r in monitor.audit(limit)]

    @api.get("/conversation", tags=["conversation"])
    def conversation(id: Annotated[str, Query(min_length=1, max_length=256,
                                              description="a message id or correlation id")],
                     ) -> models.Conversation:
        """The messages of the conversation ``id`` belongs to and where each one is."""
        return models.Conversation.model_validate(_fields(monitor.conversation(id)))


def _endpoint_row(monitor: Monitor, name: str, period: float) -> models.EndpointRow:
    readings: dict[str, Any] = {
        "depth": monitor.depth(name), "oldest": monitor.oldest(name),
        "poison": monitor.poisoned(name),
        "paused": monitor.paused(name), "deferred": monitor.deferred_count(name),
        "scheduled": monitor.scheduled_count(name), "stats": monitor.stats(name, period),
        "instances": monitor.instances()}
    errors = {field: r.error for field, r in readings.items() if r.error is not None}
    paused = readings["paused"].value
    stats = readings["stats"].value
    letters = readings["poison"].value
    oldest = readings["oldest"].value
    known = readings["instances"].value
    now = monitor.poller.now()
    live = None if known is None else [i.id for i in known
                                        if name in i.endpoints and i.live(now)]
    return models.EndpointRow(
        name=name, queue=monitor.bus.names.queue(name), depth=readings["depth"].value,
        oldest_age_seconds=None if oldest is None else max(0.0, time.time() - oldest),
        poison=None if letters is None else len(letters),
        paused=models.PauseInfo(until=paused.until, reason=paused.reason) if paused else None,
        deferred=readings["deferred"].value, scheduled=readings["scheduled"].value,
        stats=None if stats is None else models.Stats.model_validate(_fields(stats)),
        read_at=min(r.read_at for r in readings.values()), live=live,
        unserved=live == [] and bool(readings["depth"].value), errors=errors)


def _pause_result(monitor: Monitor, endpoint: str) -> models.PauseResult:
    paused = monitor.paused(endpoint).value
    return models.PauseResult(endpoint=endpoint, paused=models.PauseInfo(
        until=paused.until, reason=paused.reason) if paused else None)


def _blocking(letters: list[PoisonedMessage], session: dict[str, Any]) -> list[str]:
    """The ids of the poison entries holding a gap of a waiting ``session`` (its summary):
    copies of the session whose number is the one a stream waits for next."""
    if session["status"] not in ("stuck", "waiting"):
        return []
    expected: dict[str, int] = session["next"]
    return [letter.id for letter in letters
            if (envelope := letter.entry.envelope) is not None
            and envelope.session == session["session"] and envelope.stream is not None
            and envelope.sequence == expected.get(envelope.stream, 1)]


def _chosen(monitor: Monitor, endpoint: str | None) -> list[str]:
    return monitor.endpoints if endpoint is None else [monitor.check(endpoint)]


def _checked(selection: models.Selection) -> set[str]:
    ids = set(selection.ids)
    if selection.count != len(selection.ids) or len(ids) != len(selection.ids):
        raise HTTPException(400, f"the request names {len(ids)} distinct entr"
                                 f"{'y' if len(ids) == 1 else 'ies'} in {len(selection.ids)} "
                                 f"ids but its count is {selection.count}: ask for "
                                 "confirmation of exactly the entries sent, and send that "
                                 "count")
    return ids


def _fields(value: Any) -> Any:
    """A data-layer dataclass as a dict for validation (anything else as it is)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


def _exception_type(exception: str | None) -> str | None:
    """``RuntimeError: gateway down`` -> ``RuntimeError`` (how entries record exceptions)."""
    if not exception:
        return None
    head = exception.split(":", 1)[0].strip()
    return head if head and " " not in head else None


def _seen(letter: PoisonedMessage) -> float:
    return letter.entry.poisoned_at.timestamp()


def _entry(letter: PoisonedMessage) -> models.PoisonedEntry:
    envelope = letter.entry.envelope
    return models.PoisonedEntry(
        id=letter.id, message_id=envelope.message_id if envelope else None,
        poisoned_at=_seen(letter), reason=letter.entry.reason,
        token=letter.token.value if letter.token else "gone", replayable=letter.replayable,
        crashed=letter.crashed, retries=letter.recoveries)


def _detail(monitor: Monitor, endpoint: str, letter: PoisonedMessage) -> models.PoisonedDetail:
    entry = letter.entry
    envelope = entry.envelope
    text, note = _payload_text(monitor, endpoint, letter)
    return models.PoisonedDetail(
        endpoint=endpoint, id=letter.id, reason=entry.reason, exception=entry.exception,
        exception_type=_exception_type(entry.exception), dequeue_count=entry.dequeue_count,
        poisoned_at=_seen(letter), token=letter.token.value if letter.token else "gone",
        replayable=letter.replayable,
        envelope=envelope.model_dump(mode="json") if envelope else None,
        headers=dict(envelope.headers) if envelope else {}, payload_text=text,
        payload_note=note, original_body=entry.original_body)


_SHOWN_BYTES = 256 * 1024


def _payload_text(monitor: Monitor, endpoint: str,
                  letter: PoisonedMessage) -> tuple[str | None, str | None]:
    """What the entry's detail shows of its payload, and a note on what it leaves out. A
    claim check is read only where the receiver would read it: the copy's own, at the
    poison queue's endpoint (an entry can name any blob)."""
    envelope = letter.entry.envelope
    if envelope is None:
        return None, "the entry holds no envelope (its body was never a message)"
    if envelope.encryption is not None:
        return None, "the payload is encrypted"
    if envelope.payload is not None:
        if envelope.payload_encoding == "utf-8":
            return envelope.payload, None
        try:
            return base64.b64decode(envelope.payload).decode("utf-8"), None
        except (binascii.Error, UnicodeDecodeError):
            return None, "the payload is binary (base64 in the envelope)"
    if envelope.payload_ref is not None:
        payloads = monitor.bus.parts.payloads
        if not payloads.confined(envelope, endpoint):
            return None, payloads.outside(envelope, endpoint)
        data = payloads.get(envelope.payload_ref)
        if data is None:
            return None, "its claim-check blob is gone"
        shown = data[:_SHOWN_BYTES].decode("utf-8", errors="replace")
        cut = len(data) > _SHOWN_BYTES
        return shown, (f"the first {_SHOWN_BYTES} of {len(data)} bytes" if cut else None)
    return None, "the envelope carries no payload"
