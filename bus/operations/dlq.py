"""``python -m bus dlq list|show|replay|purge ENDPOINT``: an endpoint's poisoned messages.

``dlq`` (dead-letter queue, the name every broker's operators know) is the poison queue.

The commands connect to the account the app is configured for (``AzureWebJobsStorage`` or
``AzureWebJobsStorage__accountName``, as in the Functions app; ``local.settings.json`` is not
read - export the setting). Replaying is exactly-once: see ``bus.protocol.poison.poisoned``.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import TypeVar

import click

from bus.errors import ConfigurationError
from bus.operations.apps import AppError, load_bus
from bus.protocol.poison.poisoned import EntryFilter, PoisonedMessage, PoisonedMessages

F = TypeVar("F", bound=Callable[..., object])


class DlqProblem(click.ClickException):
    exit_code = 2


def _poison_queue(app: str, endpoint: str) -> PoisonedMessages:
    try:
        return load_bus(app).poisoned(endpoint)
    except (AppError, ConfigurationError) as exc:
        raise DlqProblem(str(exc)) from exc


def _ids(ids: tuple[str, ...], every: bool) -> set[str] | None:
    if every == bool(ids):
        raise click.UsageError("name the entries (their ids, from `dlq list`) or pass --all")
    return None if every else set(ids)


@click.group()
def dlq() -> None:
    """Poisoned messages: what an endpoint's poison queue holds, and replaying or purging it."""


def _moment(text: str | None) -> float | None:
    """``--since``/``--until``: an ISO 8601 time (UTC unless it says), or how long ago:
    ``90s``, ``30m``, ``2h``, ``7d``."""
    if text is None:
        return None
    found = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", text.strip())
    if found:
        return time.time() - float(found[1]) * _UNITS[found[2]]
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise click.BadParameter(f"{text!r} is neither an ISO 8601 time nor a duration ago "
                                 "(90s, 30m, 2h, 7d)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def filter_options(command: F) -> F:
    """The options that choose entries (``EntryFilter``)."""
    for option in reversed([
            click.option("--type", "message_type", metavar="TYPE",
                         help="Only entries of this message type."),
            click.option("--exception", metavar="TEXT",
                         help="Only entries whose last exception contains TEXT."),
            click.option("--reason", metavar="TEXT",
                         help="Only entries whose reason contains TEXT."),
            click.option("--since", metavar="WHEN",
                         help="Only entries poisoned since WHEN (ISO 8601, or 2h, 7d ago)."),
            click.option("--until", metavar="WHEN",
                         help="Only entries poisoned before WHEN (ISO 8601, or 2h, 7d ago).")]):
        command = option(command)
    return command


def _filter(message_type: str | None, exception: str | None, reason: str | None,
            since: str | None, until: str | None) -> EntryFilter | None:
    if not any((message_type, exception, reason, since, until)):
        return None
    return EntryFilter(message_type, exception, reason, _moment(since), _moment(until))


@dlq.command("list")
@click.argument("endpoint")
@click.option("--app", default="function_app", show_default=True, metavar="MODULE[:NAME]")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per entry.")
@filter_options
def list_command(endpoint: str, app: str, as_json: bool, *, message_type: str | None,
                 exception: str | None, reason: str | None, since: str | None,
                 until: str | None) -> None:
    """The entries of ENDPOINT's poison queue, oldest first (those the filters choose)."""
    where = _filter(message_type, exception, reason, since, until)
    letters = _poison_queue(app, endpoint).entries(where=where)
    for letter in letters:
        if as_json:
            click.echo(json.dumps(_summary(letter)))
        else:
            s = _summary(letter)
            crash = f"CRASH ({s['retries']} automatic retries)  " if s["crashed"] else ""
            click.echo(f"{s['id']}  {s['poisoned_at']}  {s['message_type'] or '-'}  "
                       f"{s['message_id'] or '-'}  deliveries {s['dequeue_count']}  "
                       f"token {s['token']}  {crash}{s['reason']}")
    if not as_json:
        chosen = " matching the filters" if where is not None else ""
        click.echo(f"{len(letters)} poisoned message(s) at {endpoint}{chosen}")


@dlq.command("show")
@click.argument("endpoint")
@click.argument("entry_id")
@click.option("--app", default="function_app", show_default=True, metavar="MODULE[:NAME]")
def show_command(endpoint: str, entry_id: str, app: str) -> None:
    """One entry in full: reason, exception, delivery count and the original envelope."""
    for letter in _poison_queue(app, endpoint).entries():
        if letter.id == entry_id:
            click.echo(json.dumps({**_summary(letter), "exception": letter.entry.exception,
                                   "envelope": letter.entry.envelope.model_dump(mode="json")
                                   if letter.entry.envelope else None,
                                   "original_body": letter.entry.original_body}, indent=2))
            return
    raise DlqProblem(f"no entry {entry_id!r} in the poison queue of {endpoint!r}")


@dlq.command("replay")
@click.argument("endpoint")
@click.argument("entry_ids", nargs=-1)
@click.option("--all", "every", is_flag=True, help="Replay every entry.")
@click.option("--drop-expiry", is_flag=True,
              help="Send the messages without their time-to-live (expires_at): an expired "
                   "message is then handled instead of expiring again.")
@click.option("--app", default="function_app", show_default=True, metavar="MODULE[:NAME]")
def replay_command(endpoint: str, entry_ids: tuple[str, ...], every: bool, drop_expiry: bool,
                   app: str) -> None:
    """Put entries back on ENDPOINT's queue; each message's effect still happens once."""
    wanted = _ids(entry_ids, every)
    poisoned = _poison_queue(app, endpoint)
    results = poisoned.replay(wanted, drop_expiry=drop_expiry)
    for entry_id, result in results.items():
        click.echo(f"{entry_id}  {result.value}")
    missing = sorted((wanted or set()) - set(results))
    for entry_id in missing:
        click.echo(f"{entry_id}  not found", err=True)
    if missing:  # reading leases entries (a failed read leaves its lease on): say so
        click.echo("(replayed or purged since, or held by another reader of the poison "
                   f"queue: held entries show again within {poisoned.peek_lease:g} s)",
                   err=True)
    click.echo(f"{sum(r.value in ('replayed', 'resent') for r in results.values())} "
               f"replayed, {len(results)} looked at")
    if missing:
        raise SystemExit(1)


@dlq.command("purge")
@click.argument("endpoint")
@click.argument("entry_ids", nargs=-1)
@click.option("--all", "every", is_flag=True, help="Purge every entry.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option("--app", default="function_app", show_default=True, metavar="MODULE[:NAME]")
def purge_command(endpoint: str, entry_ids: tuple[str, ...], every: bool, yes: bool,
                  app: str) -> None:
    """Delete entries for good (and their poisoned messages' tokens and payloads)."""
    wanted = _ids(entry_ids, every)
    if not yes:
        click.confirm(f"purge {'every entry' if every else len(entry_ids)} of {endpoint}'s "
                      "poison queue for good?", abort=True)
    poisoned = _poison_queue(app, endpoint)
    purged = poisoned.purge(wanted)
    for entry_id, why in poisoned.refusals.items():
        click.echo(f"{entry_id}  {why}", err=True)
    click.echo(f"{len(purged)} purged" + (f", {len(poisoned.refusals)} kept"
                                          if poisoned.refusals else ""))


def _summary(letter: PoisonedMessage) -> dict[str, object]:
    envelope = letter.entry.envelope
    return {"id": letter.id, "poisoned_at": letter.entry.poisoned_at.isoformat(),
            "reason": letter.entry.reason, "dequeue_count": letter.entry.dequeue_count,
            "message_type": envelope.message_type if envelope else None,
            "message_id": envelope.message_id if envelope else None,
            "expires_at": envelope.expires_at.isoformat()
            if envelope and envelope.expires_at else None,
            "token": letter.token.value if letter.token else "gone",
            "replayable": letter.replayable, "crashed": letter.crashed,
            "retries": letter.recoveries}
