"""The operator at the console: every operator action, through each of the three ways in.

An operator acts through the Python API (``bus.poisoned(...)``, ``bus.pause(...)``, ...), the
command line (``python -m bus dlq replay ...``, run in-process by its click tree against the
run's bus) or the dashboard (the API's route functions, called with the request bodies the
pages send, over a ``Monitor`` of the run's bus). Each kind of action takes the three ways in
turn, from one drawn at random, so every command, every route and every method is driven
whenever a run does that kind of thing a few times, at random moments, while the workers run
and storage fails.

What it does: decides, once per entry, what becomes of each Brief's poison entry at ``t``
(replay, replay without its time-to-live, purge, or - for a reason replaying cannot cure -
leave it) and does it; pauses and resumes ``t``; and reads everything an operator reads
(entries, deferred and scheduled messages, sessions, conversations, state, statistics). In
some runs it pauses ``s`` from the start (a deployment under way), and a second operator
watches the sessions and closes one the moment a copy of it is set aside
(``Console.watcher``): the moment between the commit that lists the copy as waiting and its
deferral, which an operator acting at random moments seldom meets.
"""

from __future__ import annotations

import binascii
import contextlib
import dataclasses
import io
import json
import sys
import types
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from bus import Bus
from bus.adapters.memory import InMemoryStorage
from bus.errors import BusError
from bus.hosting.functions.trigger import PAUSE_WAITED_OUT_SECONDS
from bus.operations.cli import main as cli
from bus.protocol.outbox.slot import Outbox
from bus.protocol.poison.poisoned import EntryFilter
from bus.protocol.poison.queue import PoisonEntry
from bus.protocol.sessions.order import SESSION_ROW, SessionRow, decode
from bus.protocol.tokens import shards
from bus.protocol.tokens.inbox import TokenState, finished
from bus.storage import StorageError
from bus.testing.simulate import briefs, surface
from bus.testing.simulate.entries import whole_entry
from bus.testing.simulate.sessions import ENDPOINT as SESSIONS
from bus.testing.simulate.sessions import settled
from bus.testing.simulate.workload import SessionPlan
from bus.testing.simulate.world import START_TIME, Actor, World

APP_MODULE = "bus_simulated_app"
"""The module the command line loads its bus from (``--app bus_simulated_app``)."""
LEAVE, REPLAY, DROP_EXPIRY, PURGE = "leave", "replay", "replay without expiry", "purge"
WAYS = ("api", "cli", "dashboard")


def _entry_key(entry: PoisonEntry) -> tuple[str, str, str] | None:
    if entry.envelope is None:
        return None
    return entry.envelope.message_id, entry.reason, entry.poisoned_at.isoformat()


class Console:
    """One operator, acting every few seconds (see the module's docstring)."""

    def __init__(self, bus: Bus, world: World, plan: briefs.BriefPlan | None,
                 routes: Counter[str], *, sessions: SessionPlan | None = None,
                 deploying: float | None = None, purging: bool = False) -> None:
        """``deploying``: the seconds ``s`` is paused for from the run's start (its bounded
        queue fills while the client numbers its first sends), or None. ``purging``: an
        operator cleaning up during an incident - every few tenths of a second, everything in
        ``t``'s poison queue is purged (a focused workload: ``run_once(purging=True)``)."""
        self._purging = purging
        storage = bus.storage
        assert isinstance(storage, InMemoryStorage)
        self._storage = storage
        self._bus = bus
        self._world = world
        self._plan = plan
        self._routes = routes
        self._sessions = sessions
        self._deploying = deploying
        self.decisions: dict[tuple[str, str, str], str] = {}
        self.watched: set[str] = set()
        """Sessions the watcher closed (``watcher``): the console leaves them be, so what
        the close released - or missed - stays as it left it."""
        self.violations: list[str] = []
        """What the watcher saw go wrong as it happened (``watcher``)."""
        self._turns: dict[str, int] = {}
        self._api = _dashboard_routes(bus, world)
        app = types.ModuleType(APP_MODULE)
        app.bus = bus  # type: ignore[attr-defined]
        sys.modules[APP_MODULE] = app

    def actor(self) -> Actor:
        return Actor("console", self.run)

    def watcher(self, counts: Counter[str]) -> Actor:
        """An operator who watches the sessions' page and closes a session as soon as a copy
        of it is set aside - now and then, for one in four such copies. Woken by
        the copy's commit (its session row changed, read outside the faults), it acts at
        once (urgent): before the worker that committed the copy has deferred it. An
        operator's action completes the partition's unfinished record first, so the copy is
        deferred before the action releases what waits (the ``act-on-unfinished`` break).

        Once its close is through (or given up), the watcher looks (outside the faults,
        before anyone else moves) whether a copy the closed session lists as waiting is still
        to be deferred by its partition's unfinished record: a deferral after the close that
        nothing but maintenance would release, a pass later. That is a violation even though
        maintenance heals it, and the only moment it shows: the run's end cannot tell it."""
        assert self._sessions is not None
        watch = _Watch(self, counts)
        return Actor("session-watcher", watch.run, alarm=watch.set_aside_now, urgent=True)

    # -- what the run asks of it ------------------------------------------------------------
    def waiting(self, body: str) -> bool:
        """Whether an entry of ``t``'s poison queue still waits for this operator (or for
        maintenance's adoption: a copy the host moved there): anything but an entry it
        decided to leave while its message waits, or the sweeper's report of a presumed
        orphan (no message in it)."""
        try:
            entry = whole_entry(self._storage, body)
        except (ValueError, binascii.Error):
            return True
        key = _entry_key(entry)
        return key is not None and (self.decisions.get(key) != LEAVE or self._stale(entry))

    def _stale(self, entry: PoisonEntry) -> bool:
        """Whether the entry's message was processed (or purged) since: its token is gone,
        as the listings show (read outside the faults). An entry written before its message
        was processed (a duplicate entry, a write that landed late) is left by no operator:
        a replay removes it as stale, or a purge does."""
        if entry.envelope is None:
            return False
        attempt_id = entry.envelope.attempt_id
        return self._storage.tables.stored(self._bus.names.tokens_table,
                                           shards.partition(briefs.ENDPOINT, attempt_id),
                                           attempt_id) is None

    # -- the loop ---------------------------------------------------------------------------
    def run(self) -> None:
        rng = self._world.rng
        unfinished: _Step | None = None
        for _ in range(3 if self._deploying else 0):  # a deployment of s under way
            with contextlib.suppress(StorageError):
                assert self._deploying is not None
                self._bus.pause(SESSIONS, self._deploying, reason="deploying")
                break
        # A deployment happens once: restarted after a crash, the operator does not deploy
        # again (pausing s anew on every restart kept it paused for good in a crashy run,
        # while the copies put back during the pause multiplied on send faults).
        self._deploying = None
        while True:
            # A replay or purge that kept failing is run again, as it was, before anything
            # else: an operator whose command failed runs it again (a replay stopped between
            # reviving a token and sending its signal leaves the token live with no signal) -
            # but not once every entry it names is gone: its last act is deleting an entry,
            # so it did its work and failed after (a replay whose answer was lost), and run
            # again it would only ever find nothing.
            self._world.sleep(rng.uniform(0.05, 0.3) if self._purging else rng.uniform(0.5, 3.0))
            step = unfinished if unfinished is not None and not self._done(unfinished) else None
            action = self._purge_all if self._purging else rng.choice((
                self._entries, self._entries, self._pause, self._read, self._read,
                self._session_at_random, self._purge_tallies))
            for _ in range(3):  # what failed is tried again soon, as an operator would
                try:
                    with self._world.urgently():
                        self._stuck_sessions()
                        if step is None:
                            step = action()
                        if step is not None:
                            step.run()
                    step = None
                    break
                except (StorageError, BusError, click.ClickException, SystemExit, _Refused):
                    self._world.sleep(0.2)
            unfinished = step

    def _done(self, step: _Step) -> bool:
        """Whether none of the entries ``step`` names is in ``t``'s poison queue any more (a
        command for every entry is never done so: it runs until it succeeds)."""
        if step.every:
            return False
        listed = {entry_id for entry_id, _ in self._storage.queues.listed(
            self._bus.names.poison_queue(briefs.ENDPOINT))}
        return not listed.intersection(step.ids)

    def _way(self, kind: str) -> str:
        """The way in for this ``kind`` of action: the next of the three, from a random one."""
        if kind not in self._turns:
            self._turns[kind] = self._world.rng.randrange(len(WAYS))
        self._turns[kind] += 1
        way = WAYS[self._turns[kind] % len(WAYS)]
        return "api" if way == "dashboard" and self._api is None else way

    def _entries(self) -> _Step | None:
        """Decide what becomes of each new entry at ``t``; the command that does one kind of
        it (to run, and to run again as it is if it fails)."""
        if self._plan is None:
            return None
        rng = self._world.rng
        present = self._present()
        for key, entry in present.items():
            fresh = key not in self.decisions
            if fresh or (self.decisions[key] == LEAVE and self._stale(entry)):
                # A stale entry (its message processed since) is replayed or purged, not left.
                self.decisions[key] = (_decide(entry, rng.random()) if not self._stale(entry)
                                       else REPLAY if rng.random() < 0.5 else PURGE)
                if fresh and (entry.exception or "").startswith("AssertionError"):
                    self._plan.failed_checks.append(entry.exception or "")
        kinds = sorted({self.decisions[key] for key in present} - {LEAVE})
        if not kinds:
            return None
        wanted = rng.choice(kinds)
        chosen = {key for key in present if self.decisions[key] == wanted}
        every = all(self.decisions[key] in (wanted, LEAVE) or wanted == PURGE
                    for key in present) and rng.random() < 0.3
        ids = self._ids(chosen)
        if not ids and not every:
            return None
        if wanted == PURGE:
            way = self._way("purge")
            return _Step(lambda: self._purge(ids, every, way), ids, every)
        way, every = self._way("replay"), every and wanted == REPLAY
        return _Step(lambda: self._replay(ids, every, drop_expiry=wanted == DROP_EXPIRY,
                                          way=way), ids, every)

    def _purge_all(self) -> _Step | None:
        """Purge every entry of ``t`` (the focused workload's one action), and decide so for
        each entry present, as ``_entries`` would have."""
        present = self._present()
        if not present:
            return None
        for key in present:
            self.decisions.setdefault(key, PURGE)
        way = self._way("purge")
        return _Step(lambda: self._purge([], True, way), [], True)

    def _present(self) -> dict[tuple[str, str, str], PoisonEntry]:
        """The Brief entries in ``t``'s poison queue now (read outside the faults)."""
        found: dict[tuple[str, str, str], PoisonEntry] = {}
        for body in self._storage.queues.bodies(self._bus.names.poison_queue(briefs.ENDPOINT)):
            with contextlib.suppress(ValueError, binascii.Error):
                entry = whole_entry(self._storage, body)
                key = _entry_key(entry)
                if key is not None and entry.envelope is not None \
                        and entry.envelope.message_type in briefs.TYPES:
                    found[key] = entry
        return found

    def _ids(self, chosen: set[tuple[str, str, str]]) -> list[str]:
        """The entry ids of the chosen entries, as the operator's last listing showed them
        (read outside the faults: a listing is driven by ``_read``)."""
        found: list[str] = []
        for entry_id, body in self._storage.queues.listed(
                self._bus.names.poison_queue(briefs.ENDPOINT)):
            with contextlib.suppress(ValueError, binascii.Error):
                if _entry_key(whole_entry(self._storage, body)) in chosen:
                    found.append(entry_id)
        return sorted(found)

    def _replay(self, ids: list[str], every: bool, *, drop_expiry: bool, way: str) -> None:
        if way == "api":
            self._bus.poisoned(briefs.ENDPOINT).replay(None if every else set(ids),
                                                      drop_expiry=drop_expiry)
        elif way == "cli":
            self._command("dlq", "replay", briefs.ENDPOINT, *(["--all"] if every else ids),
                          *(["--drop-expiry"] if drop_expiry else []))
        elif ids:  # the dashboard names the entries it shows: it has no "all"
            from bus.operations.dashboard import models

            options = ["drop_expiry"] if drop_expiry else []
            self._route("POST", "/api/poisoned/{endpoint}/replay", options,
                        endpoint=briefs.ENDPOINT, selection=models.ReplaySelection(
                            ids=ids, count=len(ids), drop_expiry=drop_expiry))

    def _purge(self, ids: list[str], every: bool, way: str) -> None:
        """Purge the entries, recording the messages whose entries went (read before and
        after, outside the faults: only this operator removes Briefs' entries but by
        replaying) or whose tokens did (a purge that failed after it deleted a token leaves
        the entry, which a replay later removes as stale) - and, by the purge's audit
        records, those whose entries appeared while the command ran."""
        before, recorded = self._present(), self._purge_records()
        try:
            if way == "api":
                self._bus.poisoned(briefs.ENDPOINT).purge(None if every else set(ids))
            elif way == "cli":
                self._command("dlq", "purge", briefs.ENDPOINT, "--yes",
                              *(["--all"] if every else ids))
            elif ids:
                from bus.operations.dashboard import models

                self._route("POST", "/api/poisoned/{endpoint}/purge", [],
                            endpoint=briefs.ENDPOINT,
                            selection=models.Selection(ids=ids, count=len(ids)))
        finally:
            assert self._plan is not None
            after = self._present()
            self._plan.purged.update(key[0] for key, entry in before.items()
                                     if key not in after or self._stale(entry))
            # A purge of every entry also purges one written while it ran (after ``before``
            # was read): its audit record names the messages it acted on, whose tokens it
            # deleted (those still there were kept).
            self._plan.purged.update(self._tokens_gone(self._purge_records() - recorded))

    def _purge_records(self) -> set[tuple[str, str]]:
        """The audit records of purges at ``t`` so far: (row key, a message id it names),
        read outside the faults."""
        found: set[tuple[str, str]] = set()
        for row in self._storage.tables.rows(self._bus.names.audit_table):
            if row.properties.get("action") == "purge" and \
                    row.properties.get("endpoint") == briefs.ENDPOINT:
                target = json.loads(str(row.properties.get("target", "{}")))
                found.update((row.row_key, m) for m in target.get("messages", []))
        return found

    def _tokens_gone(self, records: set[tuple[str, str]]) -> set[str]:
        """The messages named in ``records`` that have no token at ``t`` any more - but the
        fences of attempts their sender gave up on (a send retried with a new attempt id
        fences the old one's token, which the sweeper removes later: never the purged one)."""
        named = {message_id for _, message_id in records}
        live = {str(row.properties.get("message_id"))
                for row in self._storage.tables.rows(self._bus.names.tokens_table)
                if shards.endpoint_of(row.partition_key) == briefs.ENDPOINT
                and row.properties.get("state") != TokenState.FENCED.value}
        return named - live

    def _pause(self) -> None:
        rng = self._world.rng
        # t, or s when it has the sessions: paused, its queue fills (bounded: a client's
        # numbered send is refused for room, and must take no number).
        target = briefs.ENDPOINT if self._plan is not None else rng.choice(
            sorted(self._bus.topology.endpoints))
        if self._sessions is not None and rng.random() < 0.5:
            target = SESSIONS
        seconds, reason = rng.uniform(0.5, 4.0), rng.choice(("", "deploying"))
        if rng.random() < 0.2:  # longer than a Functions invocation waits out: put back
            seconds += PAUSE_WAITED_OUT_SECONDS
        pause = rng.random() < 0.6
        # No command pauses: the API, or (the command line drawn) the dashboard when it is there.
        if self._way("pause") == "api" or self._api is None:
            if pause:
                self._bus.pause(target, seconds, reason=reason)
            else:
                self._bus.resume(target)
            self._bus.paused(target)
            return
        from bus.operations.dashboard import models

        if pause:
            self._route("POST", "/api/endpoints/{endpoint}/pause",
                        ["reason"] if reason else [], endpoint=target,
                        request=models.PauseRequest(seconds=seconds, reason=reason))
        else:
            self._route("POST", "/api/endpoints/{endpoint}/resume", [], endpoint=target)

    def _read(self) -> None:
        """One of the operator's reads, through one way in."""
        rng = self._world.rng
        endpoint = rng.choice(sorted(self._bus.topology.endpoints))
        way = self._way("read")
        if way == "cli":
            self._read_by_command(endpoint, rng.random())
        elif way == "dashboard":
            self._read_by_route(endpoint, rng.random())
        else:
            self._read_by_api(endpoint, rng.random())

    def _read_by_api(self, endpoint: str, draw: float) -> None:
        bus = self._bus
        deferred = bus.deferred("c" if draw < 0.5 else endpoint)  # c's handler defers
        listed = deferred.list()
        if listed:
            deferred.get(listed[0].message_id)
        bus.poisoned(endpoint).entries(where=_FILTERS[int(draw * len(_FILTERS))])
        sessions = bus.sessions(endpoint)
        for info in sessions.list()[:1]:
            sessions.get(info.session, info.partition if draw < 0.5 else None)
        bus.read_state(endpoint, "p0", "counter")
        bus.instances()
        if draw < 0.5:
            bus.health()
        else:
            bus.health(now=self._world.now())
        bus.flush_stats()
        if draw < 0.5:
            bus.audit_trail(limit=20)
        else:
            bus.audit_trail()

    def _read_by_command(self, endpoint: str, draw: float) -> None:
        json_output = ["--json"] if draw < 0.5 else []
        listed = self._command("dlq", "list", endpoint, "--json")
        first = next((json.loads(line)["id"] for line in listed.splitlines() if line), None)
        if first is not None:
            self._command("dlq", "show", endpoint, first)
        self._command("dlq", "list", endpoint, *json_output,
                      *_FILTER_OPTIONS[int(draw * len(_FILTER_OPTIONS))])
        sessions = self._command("sessions", "list", endpoint, "--json")
        for line in sessions.splitlines()[:1]:
            info = json.loads(line)
            partition = ["--partition", info["partition"]] if draw < 0.5 else []
            self._command("sessions", "show", endpoint, info["session"], *partition)
        self._command("sessions", "list", endpoint, *json_output)
        self._command("audit", *(["--limit", "20"] if draw < 0.5 else []), *json_output)
        self._command("status", *json_output, *(["--check"] if draw >= 0.5 else []))

    def _read_by_route(self, endpoint: str, draw: float) -> None:
        """The dashboard's pages, each on its own: one that fails (storage trouble, a 404)
        keeps none of the others from being read, as an operator goes on to the next page."""
        if self._api is None:
            return
        scoped = {"endpoint": endpoint} if draw < 0.5 else {"endpoint": None}
        options = ["endpoint"] if draw < 0.5 else []
        self._page("GET", "/api/endpoints", ["period"] if draw < 0.5 else [],
                   period=600.0 if draw < 0.5 else 3600.0)
        groups = self._page("GET", "/api/poisoned", [])
        chosen = _FILTERS[int(draw * len(_FILTERS))]
        if chosen is not None:  # the operator narrows the page down
            given: dict[str, Any] = {name: value for name, value
                                     in dataclasses.asdict(chosen).items() if value is not None}
            given["endpoint"] = endpoint
            self._page("GET", "/api/poisoned", sorted(given), **given)
        for group in groups.groups[:1] if groups is not None else []:
            self._page("GET", "/api/poisoned/{endpoint}/{entry_id}", [],
                       endpoint=group.endpoint, entry_id=group.ids[0])
        self._page("GET", "/api/deferred", options, **scoped)
        self._page("GET", "/api/sessions", options, **scoped)
        self._page("GET", "/api/scheduled", options, **scoped)
        self._page("GET", "/api/conversation", [], id=self._some_message_id())
        self._page("GET", "/api/instances", [])
        self._page("GET", "/api/audit", ["limit"] if draw < 0.5 else [],
                   limit=20 if draw < 0.5 else 100)

    def _page(self, method: str, path: str, options: list[str], **arguments: Any) -> Any:
        """One page's read: None when it failed (the page shows the error)."""
        try:
            return self._route(method, path, options, **arguments)
        except (StorageError, _Refused):
            return None

    def release(self, endpoint: str, message_id: str, deferrals: int) -> None:
        """Release a deferred message, naming the deferral seen: by the API or the
        dashboard (``bus.testing.simulate.run``'s releaser decides which and when)."""
        if self._way("release") != "dashboard":
            self._bus.deferred(endpoint).release(message_id, deferrals=deferrals)
            return
        from bus.operations.dashboard import models

        self._route("POST", "/api/deferred/{endpoint}/{message_id}/release", ["deferrals"],
                    endpoint=endpoint, message_id=message_id,
                    request=models.ReleaseRequest(deferrals=deferrals))

    # -- sessions ---------------------------------------------------------------------------
    def _stuck_sessions(self) -> None:
        """Skip each session a gap has held up for 3 s or more (read outside the faults): what
        an operator does for a session that blocks, where no copy will fill the gap."""
        if self._sessions is None:
            return
        now = self._world.now()
        for key, partition, row in self._session_rows():
            oldest = row.oldest_wait()
            if not row.closed and oldest is not None and now - oldest >= 3.0:
                self._act_on_session("skip", key, partition)

    def _session_at_random(self) -> None:
        """Skip, or now and then close, a session at a random moment."""
        if self._sessions is None:
            return
        rows = [row for row in self._session_rows() if row[0] not in self.watched]
        if not rows:
            return
        key, partition, _ = self._world.rng.choice(rows)
        self._act_on_session("close" if self._world.rng.random() < 0.3 else "skip",
                             key, partition)

    def _purge_tallies(self) -> None:
        """Purge some of the Tallies' entries its session explains (rejected, refused): the
        operator tidying up. Recorded by label (read before and after, outside the faults)."""
        if self._sessions is None:
            return
        queue = self._bus.names.poison_queue(SESSIONS)
        before = _tally_entries(self._storage, self._storage.queues.bodies(queue))
        chosen = [key for key in before if self._world.rng.random() < 0.5]
        if not chosen:
            return
        ids = sorted(letter.id for letter in self._bus.poisoned(SESSIONS).entries()
                     if _entry_key(letter.entry) in chosen)
        try:
            if ids and self._way("tallies") == "cli":
                self._command("dlq", "purge", SESSIONS, "--yes", *ids)
            elif ids:
                self._bus.poisoned(SESSIONS).purge(set(ids))
        finally:
            after = _tally_entries(self._storage, self._storage.queues.bodies(queue))
            self._sessions.purged.update(value for key, value in before.items()
                                         if key not in after)

    def _session_rows(self) -> list[tuple[str, str, SessionRow]]:
        table = self._bus.names.state_table(SESSIONS)
        return sorted((row.row_key[len(SESSION_ROW):], row.partition_key,
                       decode(row.partition_key, row.properties))
                      for row in self._storage.tables.rows(table)
                      if row.row_key.startswith(SESSION_ROW))

    def _act_on_session(self, action: str, key: str, partition: str) -> None:
        """Skip or close the session through one way in, recorded first (see SessionPlan)."""
        assert self._sessions is not None
        (self._sessions.closed_by_operator if action == "close"
         else self._sessions.skipped_by_operator).add(key)
        named = self._world.rng.random() < 0.5
        way = self._way("session")
        if way == "api":
            sessions = self._bus.sessions(SESSIONS)
            act = sessions.close if action == "close" else sessions.skip
            act(key, partition if named else None)
        elif way == "cli":
            self._command("sessions", action, SESSIONS, key,
                          *(["--partition", partition] if named else []),
                          *(["--yes"] if action == "close" else []))
        else:
            self._route("POST", f"/api/sessions/{{endpoint}}/{{session}}/{action}",
                        ["partition"] if named else [], endpoint=SESSIONS, session=key,
                        partition=partition if named else None)

    def _some_message_id(self) -> str:
        if self._plan is not None and self._plan.message_ids:
            return self._world.rng.choice(sorted(self._plan.message_ids.values()))
        return "root0"

    # -- the ways in --------------------------------------------------------------------------
    def _command(self, *args: str) -> str:
        """``python -m bus ARGS --app bus_simulated_app``, in-process; its output."""
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            cli.main(args=[*args, "--app", APP_MODULE], prog_name="python -m bus",
                     standalone_mode=False)
        return out.getvalue()

    def _route(self, method: str, path: str, options: list[str], **arguments: Any) -> Any:
        """The dashboard's route function for ``method path``, called as the API calls it."""
        if self._api is None:
            raise _Refused("the dashboard's web stack is not installed")
        surface.count_route(self._routes, method, path, options)
        from fastapi import HTTPException

        try:
            return self._api[(method, path)](**arguments)
        except HTTPException as exc:
            raise _Refused(str(exc.detail)) from exc


_FILTERS: tuple[EntryFilter | None, ...] = (
    None, EntryFilter(message_type="Step"), EntryFilter(exception="error", reason="failed"),
    EntryFilter(since=START_TIME, until=START_TIME + 3600.0), None,
    EntryFilter(message_type="Tally", reason="expired"))
"""What an operator narrows the poison entries down to (``EntryFilter``), by a draw."""
_FILTER_OPTIONS: tuple[tuple[str, ...], ...] = (
    (), ("--type", "Step"), ("--exception", "error", "--reason", "failed"),
    ("--since", "2h", "--until", "2035-01-01T00:00:00"), ())
"""The same through the command line."""


@dataclass(frozen=True)
class _Step:
    """A command the operator runs, and runs again as it is while it fails: what it does,
    the entries it names and whether it is for every entry (``--all``)."""

    run: Callable[[], None]
    ids: list[str]
    every: bool


class _Refused(Exception):
    """A route answered with an error status (404, 409, ...): the operator reads it."""


Purged = tuple[str, tuple[str, str | None, int | None]]
"""A Tally's label, and its session, stream and number."""


class _Watch:
    """``Console.watcher``'s operator: what it has seen, and what it is to act on."""

    def __init__(self, console: Console, counts: Counter[str]) -> None:
        self._console = console
        self._counts = counts
        self._etags: tuple[str, ...] = ()
        self._seen: set[tuple[str, str, str]] = set()
        self._targets: list[tuple[str, str]] = []
        self._closed: list[tuple[str, str]] = []
        """Sessions closed since the last look, to check (``missed``)."""

    def set_aside_now(self) -> bool:
        """Whether a copy was set aside since the last look (and, one in four, to act on)."""
        console = self._console
        closed, self._closed = self._closed, []
        console.violations.extend(filter(None, (self.missed(*c) for c in closed)))
        table = console._bus.names.state_table(SESSIONS)
        etags = tuple(row.etag or "" for row in console._storage.tables.rows(table)
                      if row.row_key.startswith(SESSION_ROW))
        if etags == self._etags:
            return False  # no session row changed: nothing decoded (this runs every step)
        self._etags = etags
        waiting = {(key, partition, w.message_id)
                   for key, partition, row in console._session_rows() for w in row.waiting}
        fresh, self._seen = sorted(waiting - self._seen), waiting
        rng = console._world.rng
        self._targets += [(key, partition) for key, partition, _ in fresh
                          if rng.random() < 0.25]
        return bool(self._targets)

    def run(self) -> None:
        console = self._console
        while True:
            console._world.sleep(3600.0)  # or less: woken by ``set_aside_now``
            targets, self._targets = self._targets, []
            for key, partition in dict.fromkeys(targets):
                if key in console.watched:
                    continue
                console.watched.add(key)
                self._counts["sessions_closed_at_set_aside"] += 1
                try:
                    console._act_on_session("close", key, partition)
                except (StorageError, BusError, click.ClickException, SystemExit, _Refused):
                    console.watched.discard(key)  # failed: the console's again
                self._closed.append((key, partition))

    def missed(self, key: str, partition: str) -> str | None:
        """What the close of ``key`` missed, if the session is closed and its partition's
        unfinished record is still to defer a copy the session lists as waiting (read on the
        scheduler's greenlet: outside the faults)."""
        bus = self._console._bus
        info = bus.sessions(SESSIONS).get(key, partition)
        if info is None or not info.closed:
            return None  # the close failed before it wrote the row
        record = Outbox(bus.storage.tables, bus.names.state_table(SESSIONS)).load(
            partition).record
        if record is None or record.deferred_signal is None or record.message_id not in {
                w.message_id for w in info.waiting}:
            return None
        if finished(record, bus.parts.inbox.read(SESSIONS, record.attempt_id)):
            return None
        return (f"session {key}: closed while copy {record.message_id} waited in it, not yet "
                "deferred; the close released nothing of it (left to maintenance)")


def _tally_entries(storage: InMemoryStorage,
                   bodies: list[str]) -> dict[tuple[str, str, str], Purged]:
    """The entries of Tallies their session explains (rejected, refused): key -> label,
    session, stream and number."""
    found: dict[tuple[str, str, str], Purged] = {}
    for body in bodies:
        with contextlib.suppress(ValueError, binascii.Error):
            entry = whole_entry(storage, body)
            key = _entry_key(entry)
            if key is not None and entry.envelope is not None and settled(entry) \
                    and entry.envelope.message_type == "Tally":
                tally = json.loads(entry.envelope.payload or "{}")
                found[key] = str(tally["label"]), (str(tally["session"]), entry.envelope.stream,
                                                   entry.envelope.sequence)
    return found


def _decide(entry: PoisonEntry, draw: float) -> str:
    """What becomes of an entry: one that replaying cannot cure may be left; an expired one may
    be replayed without its time-to-live; any may be purged."""
    if briefs.final(entry) and "expired" in entry.reason:
        return (LEAVE, DROP_EXPIRY, PURGE, REPLAY)[min(3, int(draw * 3.3))]
    if briefs.final(entry):
        return LEAVE if draw < 0.5 else PURGE
    return REPLAY if draw < 0.6 else (DROP_EXPIRY if draw < 0.7 else PURGE)


def _dashboard_routes(bus: Bus,
                      world: World) -> dict[tuple[str, str], Callable[..., Any]] | None:
    """The API's route functions by (method, path), over a ``Monitor`` of ``bus`` that reads
    afresh each time; None without the dashboard's web stack (FastAPI: Python 3.10's tests
    run without it, and the operator then acts through the other two ways)."""
    try:
        from fastapi.routing import APIRoute

        from bus.operations.dashboard import api, models
        from bus.operations.dashboard.monitor import Monitor
        from bus.operations.dashboard.poller import Poller
    except ImportError:
        return None
    monitor = Monitor(bus, Poller(0.0, clock=world.now))
    settings = models.Settings(allow_actions=True, depth_seconds=0.0,
                               endpoints=monitor.endpoints, prefix=bus.names.prefix,
                               how_to_allow="")
    found: dict[tuple[str, str], Callable[..., Any]] = {}
    for route in api.router(monitor, settings).routes:
        if isinstance(route, APIRoute):
            found.update({(method, route.path): route.endpoint for method in route.methods or ()})
    return found
