"""``python -m bus``: commands for the people who deploy and operate a bus.

    python -m bus topology export [--app function_app] [--out infra/topology.json] [--prefix P]
    python -m bus topology show   [--app function_app]
    python -m bus topology check  [--app function_app] [--file infra/topology.json]
    python -m bus contracts export [--app function_app] [--out contracts.json]
    python -m bus contracts check OLD [NEW] [--app function_app]   (docs/contracts.md)
    python -m bus init FOLDER                  a new app on the bus, ready for Azurite
    python -m bus provision [--app function_app]
    python -m bus worker [--app function_app] [--endpoint NAME]... [--until-idle]
    python -m bus dlq list|show|replay|purge ENDPOINT [...]   (see bus/operations/dlq.py)
    python -m bus sessions list|show|skip|close ENDPOINT [SESSION]  (bus/operations/sessions.py)
    python -m bus status [--json] [--check]    instances serving each endpoint, what waits
    python -m bus dashboard [--app function_app] [--host 127.0.0.1 [--allowed-host NAME]...]
                            [--port 8080] [--allow-actions] [--depth-seconds 30]
                            (docs/dashboard.md)

Exit codes: 0 done, 1 the check found a difference, 2 wrong usage or an app that cannot load.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from pydantic import ValidationError

from bus.bus import Bus
from bus.errors import ConfigurationError, NamingError, NotProvisioned, RoutingError
from bus.hosting.worker import Worker
from bus.messages import Command, Event, Message
from bus.operations import contracts_file, local_run, scaffold
from bus.operations.apps import DEFAULT_APP, AppError, load_bus
from bus.operations.audit import audit
from bus.operations.dlq import dlq
from bus.operations.sessions import sessions
from bus.operations.status import status
from bus.operations.topology_file import DEFAULT_PATH, TopologyFile, drift
from bus.storage import StorageError

F = TypeVar("F", bound=Callable[..., object])


class UsageProblem(click.ClickException):
    """A problem the user fixes by changing the command or the app: exit code 2."""

    exit_code = 2


def app_option(command: F) -> F:
    """``--app``: the module (or ``module:attribute``) that defines the bus."""
    return click.option(
        "--app", default=DEFAULT_APP, show_default=True, metavar="MODULE[:NAME]",
        help="Module that defines the bus (a Bus or BusFunctions at module level), imported "
             "from the current directory.")(command)


def _load(app: str) -> Bus:
    try:
        return load_bus(app, offline=True)
    except AppError as exc:
        raise UsageProblem(str(exc)) from exc


def _describe(app: str, prefix: str | None) -> TopologyFile:
    try:
        return TopologyFile.from_bus(_load(app), app=app, prefix=prefix)
    except (ConfigurationError, NamingError) as exc:
        raise UsageProblem(str(exc)) from exc


def _write(text: str, out: Path, what: str = "") -> None:
    """An export's text to ``out`` (its folder made), or to stdout when ``out`` is '-'."""
    if str(out) == "-":
        click.echo(text, nl=False)
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    click.echo(f"wrote {out}{what}")


@click.group()
def main() -> None:
    """Operate an exactly-once bus on Azure Storage."""


main.add_command(dlq)
main.add_command(sessions)
main.add_command(audit)
main.add_command(status)


@main.group()
def topology() -> None:
    """The app's endpoints, topics and storage names, and the file infra/ deploys them from."""


@topology.command("export")
@app_option
@click.option("--out", type=click.Path(dir_okay=False, allow_dash=True, path_type=Path),
              default=DEFAULT_PATH, show_default=True, help="File to write ('-': stdout).")
@click.option("--prefix", default=None,
              help="Resource-name prefix of the deployment (BUS_PREFIX there). "
                   "Default: the app's BUS_PREFIX, normally empty.")
def export_command(app: str, out: Path, prefix: str | None) -> None:
    """Write the topology file that infra/main.bicep deploys."""
    _write(_describe(app, prefix).to_json(), out)


@topology.command("show")
@app_option
@click.option("--prefix", default=None, help="Resource-name prefix (default: the app's).")
def show_command(app: str, prefix: str | None) -> None:
    """Print the endpoints, their storage and the topics' subscribers."""
    described = _describe(app, prefix)
    click.echo(f"app {described.app}, prefix {described.prefix or '(none)'}")
    rows = [("endpoint", "queue", "poison queue", "state table")]
    rows += [(e.name, e.queue, e.poison_queue, e.state_table) for e in described.endpoints]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        cells = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        click.echo(("  " + "  ".join(cells)).rstrip())
    click.echo(f"tables {', '.join(described.tables)}; "
               f"containers {', '.join(described.containers)}")
    for topic in described.topics:
        click.echo(f"topic {topic.topic} -> {', '.join(topic.subscribers)}  "
                   f"({described.topic_container}/{topic.blob})")
    for message_type, endpoint in described.routes.items():
        click.echo(f"command {message_type} -> {endpoint}")


@topology.command("check")
@app_option
@click.option("--file", "path", type=click.Path(dir_okay=False, path_type=Path),
              default=DEFAULT_PATH, show_default=True, help="The committed topology file.")
def check_command(app: str, path: Path) -> None:
    """Exit 1 when the topology file is stale relative to the app (and show the diff)."""
    try:
        result = drift(_load(app), path, app=app)
    except (ConfigurationError, NamingError) as exc:
        raise UsageProblem(str(exc)) from exc
    if result.in_sync:
        click.echo(f"{path} is in sync with {app}")
        return
    click.echo(result.diff(), err=True, nl=False)
    state = "is missing" if result.committed is None else "is stale"
    click.echo(f"{path} {state}: run `python -m bus topology export --app {app} --out {path}` "
               "and commit it", err=True)
    sys.exit(1)


@main.group()
def contracts() -> None:
    """The app's message contracts as JSON Schema, and whether a change breaks a deploy."""


def _app_contracts(app: str) -> dict[str, Any]:
    bus = _load(app)
    try:
        module = sys.modules.get(app.partition(":")[0])
        return contracts_file.export(contracts_file.contract_classes(bus, module))
    except ConfigurationError as exc:
        raise UsageProblem(str(exc)) from exc


def _contracts_file(path: Path) -> dict[str, Any]:
    try:
        return contracts_file.read(path)
    except contracts_file.ContractsFileError as exc:
        raise UsageProblem(str(exc)) from exc


@contracts.command("export")
@app_option
@click.option("--out", type=click.Path(dir_okay=False, allow_dash=True, path_type=Path),
              default=contracts_file.DEFAULT_PATH, show_default=True,
              help="File to write ('-': stdout).")
def contracts_export_command(app: str, out: Path) -> None:
    """Write every contract of the app (kind, aliases, JSON Schema) to a file to commit."""
    document = _app_contracts(app)
    _write(contracts_file.to_json(document), out, f" ({len(document['contracts'])} contracts)")


@contracts.command("check")
@click.argument("old", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("new", type=click.Path(dir_okay=False, path_type=Path), required=False)
@app_option
def contracts_check_command(old: Path, new: Path | None, app: str) -> None:
    """Exit 1 when going from the contracts in OLD to those in NEW (default: the app's as
    they are now) breaks a rolling deploy; list every change either way."""
    before = _contracts_file(old)
    after = _contracts_file(new) if new is not None else _app_contracts(app)
    result = contracts_file.compare(before, after)
    for line in result.breaking:
        click.echo(f"breaking    {line}")
    for line in result.compatible:
        click.echo(f"compatible  {line}")
    against = str(new) if new is not None else f"the contracts of {app}"
    if not result.ok:
        click.echo(f"{len(result.breaking)} breaking change(s) from {old} to {against}",
                   err=True)
        sys.exit(1)
    click.echo(f"no breaking change from {old} to {against} "
               f"({len(result.compatible)} compatible)")


@main.command("init")
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path))
def init_command(folder: Path) -> None:
    """Write a new Functions app on the bus into FOLDER: function_app.py, host.json,
    local.settings.json (Azurite), requirements.txt, send.py, the Bicep in infra/ and a
    README with the commands to run next. Nothing is overwritten."""
    try:
        made = scaffold.init(folder)
    except scaffold.ScaffoldError as exc:
        raise UsageProblem(str(exc)) from exc
    for path in made.written:
        click.echo(f"wrote {folder / path}")
    for note in made.notes:
        click.echo(note, err=True)
    click.echo(f"next: cd {folder} and follow README.md (pip install -r requirements.txt, "
               "then Azurite, python -m bus provision, python send.py, python -m bus host)")


def _unreachable(exc: StorageError) -> click.ClickException:
    return click.ClickException(
        f"storage did not answer ({exc}): is it running (Azurite: npx azurite), and is the "
        "connection in local.settings.json or the environment right?")


def _connected(app: str) -> Bus:
    """The app's bus over the storage its settings name (not the offline placeholder)."""
    try:
        return load_bus(app)
    except AppError as exc:
        raise UsageProblem(str(exc)) from exc


@main.command("provision")
@app_option
def provision_command(app: str) -> None:
    """Create the app's queues, tables, containers and topic files where its settings point
    (the environment over local.settings.json); safe to run again."""
    bus = _connected(app)
    try:
        bus.provision()
    except StorageError as exc:
        raise _unreachable(exc) from exc
    click.echo(f"provisioned {len(bus.topology.endpoints)} endpoint(s) of {app} "
               f"({', '.join(sorted(bus.topology.endpoints))}), prefix "
               f"{bus.names.prefix or '(none)'}")


@main.command("send")
@click.argument("message_type")
@click.argument("payload", default="{}")
@app_option
@click.option("--to", default=None, metavar="ENDPOINT",
              help="A command's destination, when the app does not route it (an endpoint of "
                   "another app).")
@click.option("--delay", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Seconds until it is due (scheduled delivery).")
@click.option("--correlation-id", default=None, help="Its conversation (default: its own id).")
def send_command(*, message_type: str, payload: str, app: str, to: str | None, delay: float,
                 correlation_id: str | None) -> None:
    """Send the command, or publish the event, MESSAGE_TYPE of the app's contracts, with its
    fields from PAYLOAD (a JSON object, default {}): a test message from the command line."""
    bus = _connected(app)
    contract = _contract(app, bus, message_type)
    try:
        message = contract.model_validate_json(payload)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(root)'}: {e['msg']}"
                             for e in exc.errors())
        raise UsageProblem(f"PAYLOAD is not a {message_type}: {problems}") from exc
    try:
        if isinstance(message, Command):
            message_id = bus.send(message, to=to, delay=delay, correlation_id=correlation_id)
            where = f"to {to or bus.topology.routes.get(message.message_type, '?')}"
        elif not isinstance(message, Event):
            raise UsageProblem(f"{message_type} is neither a command nor an event")
        elif to is not None:
            raise UsageProblem(f"{message_type} is an event: it goes to its topic's "
                               "subscribers, not --to an endpoint")
        else:
            message_id = bus.publish(message, delay=delay, correlation_id=correlation_id)
            where = "to its subscribers"
    except (ConfigurationError, RoutingError, NotProvisioned) as exc:
        raise UsageProblem(f"{exc} (python -m bus provision)"
                           if isinstance(exc, NotProvisioned) else str(exc)) from exc
    except StorageError as exc:
        raise _unreachable(exc) from exc
    verb = "sent" if isinstance(message, Command) else "published"
    click.echo(f"{verb} {message_type} {message_id} {where}")


def _contract(app: str, bus: Bus, message_type: str) -> type[Message]:
    """The app's contract named ``message_type`` (or an alias of it)."""
    try:
        classes = contracts_file.contract_classes(bus, sys.modules.get(app.partition(":")[0]))
    except ConfigurationError as exc:
        raise UsageProblem(str(exc)) from exc
    for cls in classes:
        if message_type == cls.message_type or message_type in cls.aliases:
            return cls
    raise UsageProblem(f"{app} has no contract {message_type!r}: it has "
                       f"{', '.join(cls.message_type for cls in classes) or 'none'}")


@main.command("worker")
@app_option
@click.option("--endpoint", "endpoints", multiple=True, metavar="NAME",
              help="An endpoint to run (repeat for each); default: every endpoint of the app.")
@click.option("--until-idle", is_flag=True,
              help="Stop once no endpoint has anything left to do (after one maintenance "
                   "pass), and print what became of each message.")
def worker_command(app: str, endpoints: tuple[str, ...], until_idle: bool) -> None:
    """Run the app's endpoints with polling workers (no Functions host needed): each leases
    its queue's messages and handles them, exactly once, until Ctrl-C."""
    bus = _connected(app)
    names = list(endpoints) or sorted(bus.topology.endpoints)
    unknown = [name for name in names if name not in bus.topology.endpoints]
    if unknown:
        raise UsageProblem(f"{app} has no endpoint {', '.join(map(repr, unknown))}: it has "
                           f"{', '.join(sorted(bus.topology.endpoints))}")
    workers = {name: Worker(bus, name) for name in names}
    if until_idle:
        try:
            outcomes = local_run.until_idle(bus, workers)
        except local_run.StillBusy as exc:
            raise click.ClickException(str(exc)) from exc
        except StorageError as exc:  # "nothing to do" would be wrong: storage may hold work
            raise _unreachable(exc) from exc
        for name in names:
            counted = ", ".join(f"{n} {o}" for o, n in sorted(outcomes[name].items()))
            click.echo(f"{name}: {counted or 'nothing to do'}")
        return
    click.echo(f"running {', '.join(names)} of {app} (Ctrl-C stops)")
    local_run.until_stopped(bus, workers)


@main.command("host")
@click.option("--script-root", type=click.Path(file_okay=False, exists=True, path_type=Path),
              default=Path("."), show_default=True,
              help="The app's folder: function_app.py, host.json, local.settings.json.")
@click.option("--until-idle", is_flag=True,
              help="Stop once no trigger has anything left to do (after one run of each timer "
                   "function: the bus's maintenance), and print what each function did.")
@click.option("--timer-seconds", type=float, default=None,
              help="Run timer functions this often instead of on their schedule.")
@click.option("--lease-seconds", type=float, default=None,
              help="Queue message lease (the Functions host's is 600 s).")
@click.option("--stats-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the invocation counters here (JSON) when stopping.")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
def host_command(*, script_root: Path, until_idle: bool, timer_seconds: float | None,
                 lease_seconds: float | None, stats_file: Path | None, log_level: str) -> None:
    """Run a Functions app locally, as `func start` would, without Core Tools: Microsoft's
    Python worker loads its function_app.py, and the local host feeds its queue triggers,
    timers and Durable orchestrations with the Functions host's queue rules (docs/functions.md),
    until Ctrl-C."""
    try:
        from bus.hosting.local.serve import StillBusy, serve
    except ImportError as exc:
        raise click.ClickException(
            f"the local host needs the Functions extra on Python 3.13 ({exc}): pip install "
            "'eobus[functions]'") from exc
    try:
        stats = serve(script_root, until_idle=until_idle, timer_seconds=timer_seconds,
                      lease_seconds=lease_seconds, stats_file=stats_file, log_level=log_level)
    except StillBusy as exc:
        raise click.ClickException(str(exc)) from exc
    if until_idle:
        for name, counters in sorted(stats["functions"].items()):
            counted = ", ".join(f"{counters[key]} {key.replace('_', ' ')}" for key in
                                ("succeeded", "failed", "timed_out", "poisoned")
                                if counters[key])
            click.echo(f"{name}: {counted or 'nothing to do'}")


@main.command("dashboard")
@app_option
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. The default serves this machine only; anything else "
                   "exposes the dashboard, with no authentication of its own, to the network.")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535))
@click.option("--allowed-host", "allowed_hosts", multiple=True, metavar="NAME",
              help="A host name (or address) the dashboard is reached by, as browsers send it in "
                   "Host; repeat for each. Required with a --host other than this machine's "
                   "loopback: any other Host is refused (a page on another site could otherwise "
                   "reach it through a DNS name of its own: DNS rebinding).")
@click.option("--allow-actions", is_flag=True,
              help="Allow replay, purge, pause, resume, release, skip and close. Without it the "
                   "dashboard is read-only and its API refuses every action (403).")
@click.option("--depth-seconds", default=30.0, show_default=True, type=click.FloatRange(min=0),
              help="Read each queue's depth (and poison queue, pause, deferred count) at most "
                   "once per this many seconds, shared by every viewer.")
def dashboard_command(app: str, *, host: str, port: int, allowed_hosts: tuple[str, ...],
                      allow_actions: bool, depth_seconds: float) -> None:
    """Serve the operations dashboard (docs/dashboard.md) on HOST:PORT."""
    local = ["127.0.0.1", "localhost", "[::1]", "::1"]
    if host not in local and not allowed_hosts:
        raise UsageProblem(
            f"--host {host} serves the dashboard beyond this machine: name each host it is "
            "reached by with --allowed-host NAME (requests naming any other Host are refused, "
            "so that a page on another site cannot reach it through a DNS name of its own)")
    try:
        import uvicorn

        from bus.operations.dashboard import create_app
    except ImportError as exc:
        raise UsageProblem(f"the dashboard needs its web stack ({exc.name} is missing): "
                           "pip install 'eobus[dashboard]' (requirements.txt pins it)") from exc
    try:
        bus = load_bus(app)
        web = create_app(bus, allow_actions=allow_actions, depth_seconds=depth_seconds)
    except (AppError, ConfigurationError) as exc:
        raise UsageProblem(str(exc)) from exc
    from starlette.middleware.trustedhost import TrustedHostMiddleware

    # A page on another site cannot reach this server through a DNS name of its own that
    # resolves to this machine (DNS rebinding): only the names it is served under are accepted
    # - and the Origin check (``guard``) compares with a Host that is one of them.
    web.add_middleware(TrustedHostMiddleware, allowed_hosts=[*local, *allowed_hosts])
    shown = f"[{host}]" if ":" in host else host
    click.echo(f"dashboard of {app} ({len(bus.topology.endpoints)} endpoints, "
               f"{'actions allowed' if allow_actions else 'read-only'}): "
               f"http://{shown}:{port}/  (API: http://{shown}:{port}/api/docs)")
    uvicorn.run(web, host=host, port=port, log_level="warning")
