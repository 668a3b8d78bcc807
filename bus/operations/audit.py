"""``python -m bus audit``: the operators' audit trail, newest first (``bus.audit``).

It connects as ``python -m bus dlq`` does (the app's storage setting) and prints one line per
action - when, who, what, at which endpoint, on what - or one JSON object each with ``--json``.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

import click

from bus.errors import ConfigurationError
from bus.operations.apps import AppError, load_bus


class AuditProblem(click.ClickException):
    exit_code = 2


@click.command("audit")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 10_000),
              help="How many of the latest actions to show.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per action.")
@click.option("--app", default="function_app", show_default=True, metavar="MODULE[:NAME]")
def audit(limit: int, as_json: bool, app: str) -> None:
    """Who replayed, purged, paused, resumed, released, skipped or closed what, and when."""
    try:
        records = load_bus(app).audit_trail(limit)
    except (AppError, ConfigurationError) as exc:
        raise AuditProblem(str(exc)) from exc
    for record in records:
        when = datetime.fromtimestamp(record.at, tz=timezone.utc).isoformat(timespec="seconds")
        if as_json:
            click.echo(json.dumps({"at": when, "who": record.who, "action": record.action,
                                   "endpoint": record.endpoint, "target": record.target}))
        else:
            click.echo(f"{when}  {record.who}  {record.action} {record.endpoint}  "
                       f"{json.dumps(record.target, sort_keys=True)}")
    if not records and not as_json:
        click.echo("no operator actions recorded in the last 30 days")
