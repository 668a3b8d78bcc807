"""``python -m bus sessions list|show|skip|close ENDPOINT [SESSION]``: an endpoint's sessions.

The commands connect as ``python -m bus dlq`` does (the app's storage setting). ``list`` shows
stuck sessions first (a gap has held up their waiting messages longer than the endpoint's
reorder window), then sessions with messages waiting, open ones, and closed ones; ``skip``
and ``close`` act through ``bus.protocol.sessions.admin``, so nothing waiting is lost.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TypeVar

import click

from bus.errors import AmbiguousSession, ConfigurationError
from bus.operations.apps import AppError, load_bus
from bus.protocol.sessions.admin import SessionInfo, Sessions


class SessionsProblem(click.ClickException):
    exit_code = 2


def _sessions(app: str, endpoint: str) -> Sessions:
    try:
        return load_bus(app).sessions(endpoint)
    except (AppError, ConfigurationError) as exc:
        raise SessionsProblem(str(exc)) from exc


def _one(sessions: Sessions, session: str, partition: str | None) -> SessionInfo:
    try:
        info = sessions.get(session, partition)
    except AmbiguousSession as exc:
        raise SessionsProblem(str(exc)) from exc
    if info is None:
        where = "" if partition is None else f" in partition {partition!r}"
        raise SessionsProblem(f"{sessions.endpoint} has no session {session!r}{where}")
    return info


F = TypeVar("F", bound=Callable[..., object])


def _app_option(command: F) -> F:
    return click.option("--app", default="function_app", show_default=True,
                        metavar="MODULE[:NAME]")(command)


def _partition_option(command: F) -> F:
    return click.option("--partition", default=None, metavar="PARTITION",
                        help="The session's partition, when its key has rows in several "
                             "(its messages map to more than one).")(command)


@click.group()
def sessions() -> None:
    """Sessions: their progress, what waits in them, skipping a gap, closing one."""


@sessions.command("list")
@click.argument("endpoint")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per session.")
@_app_option
def list_command(endpoint: str, as_json: bool, app: str) -> None:
    """ENDPOINT's sessions, stuck ones first."""
    found = _sessions(app, endpoint)
    now = found.now()
    listed = found.list()
    for info in listed:
        summary = info.summary(now, found.window)
        if as_json:
            click.echo(json.dumps(summary))
        else:
            click.echo(f"{summary['session']}  {summary['status']}  next {summary['next']}  "
                       f"waiting {summary['waiting']} for {summary['waited_seconds']} s  "
                       f"first waiting {summary['first_waiting']}  gaps {summary['gaps']}")
    if not as_json:
        stuck = sum(info.stuck(now, found.window) and not info.closed for info in listed)
        click.echo(f"{len(listed)} session(s) at {endpoint}, {stuck} stuck")


@sessions.command("show")
@click.argument("endpoint")
@click.argument("session")
@_partition_option
@_app_option
def show_command(endpoint: str, session: str, partition: str | None, app: str) -> None:
    """One session as JSON: progress per stream, waiting messages, gaps, state."""
    found = _sessions(app, endpoint)
    info = _one(found, session, partition)
    click.echo(json.dumps({**info.summary(found.now(), found.window),
                           "row": info.row.model_dump(mode="json")}, indent=2))


@sessions.command("skip")
@click.argument("endpoint")
@click.argument("session")
@_partition_option
@_app_option
def skip_command(endpoint: str, session: str, partition: str | None, app: str) -> None:
    """Move SESSION past its gap now, whatever the reorder window (recorded in the row)."""
    found = _sessions(app, endpoint)
    info = _one(found, session, partition)
    released = found.skip(session, info.partition)
    click.echo(f"{released} waiting message(s) released past the gap" if released
               else f"nothing waits in {session}: nothing to skip to")


@sessions.command("close")
@click.argument("endpoint")
@click.argument("session")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@_partition_option
@_app_option
def close_command(endpoint: str, session: str, yes: bool, partition: str | None,
                  app: str) -> None:
    """Close SESSION: its waiting and later messages go to the poison queue."""
    found = _sessions(app, endpoint)
    info = _one(found, session, partition)
    if not yes:
        click.confirm(f"close session {session!r} of {endpoint}? {len(info.waiting)} waiting "
                      "message(s) and any later ones go to its poison queue", abort=True)
    released = found.close(session, info.partition)
    click.echo(f"closed; {released} waiting message(s) released to the poison queue")
