"""Alerts: the conditions an operator wants to be told of, checked by every maintenance pass.

Per endpoint (the app's, and its readers' where the condition applies):

* ``poisoned``: entries wait in its poison queue.
* ``unserved``: messages wait in its queue and no live instance serves it (heartbeats,
  ``bus.observability.heartbeat``; not checked when ``Settings.heartbeat_seconds`` is None).
* ``critical_time``: the message at the front of its queue has waited longer than
  ``Settings.alert_critical_seconds`` - whatever waits behind it takes at least that long from
  send to processed.
* ``queue_depth``: its queue holds more than ``Settings.alert_queue_depth`` messages.
* ``stuck_session``: a session of it has waited on a gap longer than the endpoint's reorder
  window (endpoints with sessions).

Each condition that holds is reported on every pass, three ways:

* the metric ``eobus.alerts`` (a counter: one for each condition that holds, each pass;
  attributes ``eobus.alert.condition`` and ``messaging.destination.name``), which the alert
  rules of ``infra/app/alerts.bicep`` query in Application Insights (``customMetrics``);
* a log record (warning, logger ``bus.alerts``) naming the condition, the endpoint and what
  was measured;
* optionally a POST to ``Settings.alert_webhook`` (JSON) when a condition starts or stops to
  hold. Its state is kept per condition and endpoint in the instances table (partition
  ``alert``) and changed by compare-and-swap, so of several passes at once only the one that
  changed it sends; a send that fails is tried again at the next pass.

What one pass costs: per endpoint, its queue's and poison queue's lengths and a peek at its
queue (three requests), its sessions' rows when it has sessions, one read of the instances;
with a webhook, one read of the alert states and a write per change.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

import requests

from bus.bus import Bus
from bus.observability.heartbeat import EndpointHealth
from bus.storage import Conflict, Entity, NotFound, PreconditionFailed, Tables

log = logging.getLogger("bus.alerts")

CONDITIONS = ("poisoned", "unserved", "critical_time", "queue_depth", "stuck_session")
PARTITION = "alert"
WEBHOOK_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True)
class Alert:
    """One condition that holds at one endpoint."""

    condition: str
    endpoint: str
    value: float
    """What was measured: entries, messages, seconds or sessions."""
    message: str

    @property
    def key(self) -> str:
        return f"{self.condition}~{self.endpoint}"


def evaluate(bus: Bus, now: float | None = None,
             health: list[EndpointHealth] | None = None) -> list[Alert]:
    """Every condition that holds now, by endpoint (``health``: ``bus.health(now)`` read
    already)."""
    parts = bus.parts
    now = parts.clock() if now is None else now
    settings = parts.settings
    found: list[Alert] = []
    for item in bus.health(now) if health is None else health:
        name = item.endpoint
        if item.poisoned:
            found.append(Alert("poisoned", name, item.poisoned,
                               f"{item.poisoned} entries in the poison queue of {name}"))
        if settings.heartbeat_seconds is not None and item.unserved:
            found.append(Alert("unserved", name, item.depth or 0,
                               f"{item.depth} messages wait at {name} and no live instance "
                               "serves it"))
        limit = settings.alert_queue_depth
        if limit is not None and item.depth is not None and item.depth > limit:
            found.append(Alert("queue_depth", name, item.depth,
                               f"{item.depth} messages wait at {name} (over {limit})"))
        found += _critical_time(bus, name, now)
        if not item.reader and parts.topology.endpoints[name].has_sessions:
            found += _stuck_sessions(bus, name)
    return found


def _critical_time(bus: Bus, endpoint: str, now: float) -> list[Alert]:
    parts = bus.parts
    limit = parts.settings.alert_critical_seconds
    if limit is None:
        return []
    oldest = parts.observed.queues.oldest(parts.names.queue(endpoint))
    waited = 0.0 if oldest is None else now - oldest
    if waited <= limit:
        return []
    return [Alert("critical_time", endpoint, round(waited, 3),
                  f"the oldest message at {endpoint} has waited {waited:.0f} s "
                  f"(over {limit:.0f} s)")]


def _stuck_sessions(bus: Bus, endpoint: str) -> list[Alert]:
    sessions = bus.sessions(endpoint)
    now, window = sessions.now(), sessions.window
    stuck = [info for info in sessions.list() if info.stuck(now, window)]
    if not stuck:
        return []
    return [Alert("stuck_session", endpoint, len(stuck),
                  f"{len(stuck)} sessions at {endpoint} wait on a gap longer than the "
                  f"reorder window ({window:.0f} s), the first {stuck[0].session!r}")]


def report(bus: Bus, alerts: list[Alert], now: float | None = None) -> int:
    """Count each alert in ``eobus.alerts`` and log it; with a webhook, send the changes since
    the last pass. Returns how many changes were sent."""
    parts = bus.parts
    for alert in alerts:
        parts.telemetry.alerted(alert.condition, alert.endpoint)
        log.warning("bus alert %s at %s: %s", alert.condition, alert.endpoint, alert.message)
    url = parts.settings.alert_webhook
    if url is None:
        return 0
    notifier = _Notifier(parts.observed.tables, parts.names.instances_table, url,
                         parts.names.prefix, parts.clock() if now is None else now)
    return _notify(notifier, alerts)


def _notify(notifier: _Notifier, alerts: list[Alert]) -> int:
    stored = {row.row_key: row for row in notifier.tables.query(notifier.table, PARTITION)}
    holding = {alert.key: alert for alert in alerts}
    sent = 0
    for key in sorted(set(holding) | {k for k, row in stored.items() if _firing(row)}):
        alert, row = holding.get(key), stored.get(key)
        if row is not None and _firing(row) == (alert is not None) and row.properties.get(
                "notified"):
            continue  # nothing new
        sent += notifier.send(key, row, alert)
    return sent


def _firing(row: Entity) -> bool:
    return row.properties.get("firing") is True


@dataclass(frozen=True)
class _Notifier:
    tables: Tables
    table: str
    url: str
    prefix: str
    now: float

    def send(self, key: str, row: Entity | None, alert: Alert | None) -> bool:
        """Claim the change of ``key``'s state and send it; whether it was sent."""
        changed = self._claim(key, row, alert)
        if changed is None or not self._post(key, alert):
            return False
        # noted as sent: a note that fails sends it once more next pass
        with contextlib.suppress(PreconditionFailed, NotFound):
            self.tables.replace(self.table, Entity(
                PARTITION, key, {**changed.properties, "notified": True}), etag=changed.etag)
        return True

    def _claim(self, key: str, row: Entity | None, alert: Alert | None) -> Entity | None:
        """The state row as this pass writes it (the change is this pass's to send), or None
        when another pass wrote it first."""
        firing = alert is not None
        since = (self.now if row is None or _firing(row) != firing
                 else row.properties.get("since", self.now))
        properties = {"firing": firing, "since": since, "notified": False,
                      "value": alert.value if alert is not None else 0.0,
                      "message": alert.message if alert is not None else ""}
        entity = Entity(PARTITION, key, properties)
        try:
            if row is None:
                etag = self.tables.insert(self.table, entity)
            else:
                etag = self.tables.replace(self.table, entity, etag=row.etag)
        except (Conflict, PreconditionFailed, NotFound):
            return None
        return Entity(PARTITION, key, properties, etag)

    def _post(self, key: str, alert: Alert | None) -> bool:
        condition, _, endpoint = key.partition("~")
        body = {"condition": condition, "endpoint": endpoint, "prefix": self.prefix,
                "state": "firing" if alert is not None else "resolved", "at": self.now,
                "value": alert.value if alert is not None else None,
                "message": alert.message if alert is not None else
                f"{condition} at {endpoint} no longer holds"}
        try:
            answer = requests.post(self.url, json=body, timeout=WEBHOOK_TIMEOUT_SECONDS)
            answer.raise_for_status()
        except requests.RequestException as exc:  # the URL is a secret: not logged
            log.warning("bus alert webhook refused %s %s (tried again next pass): %s",
                        body["state"], key, type(exc).__name__)
            return False
        return True
