"""``python -m bus status``: is anything running? Each endpoint with its live instances and
queue depths, then every instance the heartbeats know (``bus.observability.heartbeat``).

It connects as ``python -m bus dlq`` does (the app's storage setting). An endpoint whose
messages wait with no live instance serving it is flagged ``UNSERVED``; ``--check`` then exits
with 1, for a script or a probe. ``--json`` prints one JSON object per endpoint and then per
instance, each with a ``"kind"`` of ``endpoint`` or ``instance``.
"""

from __future__ import annotations

import json

import click

from bus.errors import ConfigurationError
from bus.observability.heartbeat import EndpointHealth, Instance
from bus.operations.apps import AppError, load_bus
from bus.storage import StorageError


class StatusProblem(click.ClickException):
    exit_code = 2


@click.command("status")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object per endpoint, then one per instance.")
@click.option("--check", is_flag=True,
              help="Exit with 1 when an endpoint has messages waiting and no live instance.")
@click.option("--app", default="function_app", show_default=True, metavar="MODULE[:NAME]")
def status(as_json: bool, check: bool, app: str) -> None:
    """Which processes serve each endpoint, when each was last seen, and what waits."""
    try:
        bus = load_bus(app)
        now = bus.parts.clock()
        endpoints = bus.health(now)
        known = bus.instances()
    except (AppError, ConfigurationError) as exc:
        raise StatusProblem(str(exc)) from exc
    except StorageError as exc:
        raise StatusProblem(f"storage did not answer: {exc}") from exc
    if as_json:
        for item in endpoints:
            click.echo(json.dumps(_endpoint_json(item)))
        for instance in known:
            click.echo(json.dumps(_instance_json(instance, now)))
    else:
        _print(endpoints, known, now)
    if check and any(item.unserved for item in endpoints):
        click.get_current_context().exit(1)


def _endpoint_json(item: EndpointHealth) -> dict[str, object]:
    return {"kind": "endpoint", "endpoint": item.endpoint, "reader": item.reader,
            "live": list(item.live), "depth": item.depth, "poisoned": item.poisoned,
            "unserved": item.unserved}


def _instance_json(instance: Instance, now: float) -> dict[str, object]:
    return {"kind": "instance", "id": instance.id, "host_kind": instance.kind,
            "host": instance.host, "pid": instance.pid, "version": instance.version,
            "endpoints": list(instance.endpoints), "started_at": instance.started_at,
            "last_seen": instance.last_seen, "every": instance.every,
            "stopped": instance.stopped, "live": instance.live(now)}


def _print(endpoints: list[EndpointHealth], known: list[Instance], now: float) -> None:
    rows: list[tuple[str, ...]] = [("endpoint", "live", "queue", "poison", "")]
    for item in endpoints:
        name = f"{item.endpoint} (reader)" if item.reader else item.endpoint
        flag = ("UNSERVED: messages wait and no live instance serves it" if item.unserved
                else "")
        rows.append((name, str(len(item.live)), _count(item.depth), _count(item.poisoned),
                     flag))
    _table(rows)
    click.echo()
    rows = []
    if not known:
        click.echo("no instance has written a heartbeat (or maintenance forgot them: a day "
                   "after they were last seen)")
        return
    rows.append(("instance", "kind", "host", "pid", "version", "last seen", "state",
                 "endpoints"))
    for instance in known:
        state = ("live" if instance.live(now) else "stopped" if instance.stopped
                 else "not live")
        rows.append((instance.id, instance.kind, instance.host, str(instance.pid),
                     instance.version, _ago(now - instance.last_seen), state,
                     ", ".join(instance.endpoints)))
    _table(rows)


def _count(value: int | None) -> str:
    return "?" if value is None else str(value)


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


def _table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True)]
        click.echo("  ".join([*cells, row[-1]]).rstrip())
