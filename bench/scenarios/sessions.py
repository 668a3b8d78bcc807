"""The sessions scenario: the exactly-once hop with ordered sessions, against the unordered hop.

Endpoint ``bench-a`` handles ``Ping`` in sessions (``handles(session=...)``): Ping *i* belongs
to session ``s{i mod cfg.sessions}`` (64), which is also its state partition - the natural
setup, the session row living with the state it orders. The handler does what the unordered
hop's does (reads and increments the partition's counter row, sends one ``Pong`` to
``bench-b``) and checks the order on the way: the copy's number in its stream must follow the
one the session state recorded last, and its Ping must come after the previous one (each
session's Pings come from one producer thread). The client numbers each copy from a counter
row in the send ledger table: one read and one write per send, on the producer threads.

Each of ``cfg.session_rounds`` rounds runs both hops with the same settings, each on a fresh
Azurite: the unordered hop exactly as scenario 2 runs it (``eo_hop``: 512 partitions
round-robin), and the session hop; the first of a round swaps each round, so neither always
runs on a machine whose load drifts the same way. Reported: the medians of each hop's msgs/s
and of the rounds' ratios (session over unordered), storage operations per message of each
(the endpoint's side, counted as scenario 5 counts them), the client's requests per send, and
the copies set aside.

A hop is complete when its message's handler committed and the copy it ran for was
acknowledged. A copy that arrives ahead of its turn is set aside: committed to the session
row's waiting list, its token deferred and its signal acknowledged without running the
handler; its predecessor's commit releases it (its token live again, its kept signal sent
again - the same body). So an acknowledgement ends a hop only once the handler ran for its
message (``HandlerRuns``): when the set-aside copy is acknowledged, it has run nowhere yet.

Checked: every partition's counter equals its Pings (exactly once); every session row has
handled its Pings, numbered 1 to n, none waiting; the handler found no copy out of order; no
message poisoned; a Pong queued per Ping.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from bench.busrun import (
    Installation,
    LoadOutcome,
    check_outcomes,
    count_signals,
    drive,
    installation,
)
from bench.config import BenchConfig
from bench.cpu import CpuUse
from bench.harness import BenchError, ScenarioResult, alternating
from bench.scenarios import eo_hop
from bench.workload import (
    HOP_FROM,
    HOP_TO,
    Ping,
    Pong,
    count_effect,
    counter_row,
    partition_key,
    verify_counts,
)
from bus import Context, Endpoint
from bus.envelope import decode_signal

KEY = "sessions"
TITLE = "ordered sessions hop vs the unordered exactly-once hop"
VARIANTS = ("unordered", "same_partitions", "sessions")
NAMES = {"unordered": "unordered hop (scenario 2)",
         "same_partitions": "unordered hop, the session hop's partitions",
         "sessions": "session hop"}
IDLE = ("queue", "receive_empty")
"""Empty receives, left out of the operations per message as in scenario 5."""

OpKey = tuple[str, str]


def session_key(seq: int, sessions: int) -> str:
    """The session, and state partition, of Ping ``seq``: round-robin, the unordered hop's
    partition key over ``sessions`` partitions, so the messages of one session are spread
    over the run and the hop without sessions can use the very same partitions."""
    return partition_key(seq, sessions)


class HandlerRuns:
    """The message ids whose handler ran. An acknowledgement ends a hop only for one of them: a
    set-aside copy is acknowledged before the handler ran for its message (it ran nowhere
    yet), its released copy, the same body, after. Not by thread: a round's acknowledgements
    go out on the bus's lanes, not on the thread that ran the handler
    (``bus.protocol.receive.lanes``). A set-aside copy acknowledged late, once its released
    copy's handler ran, ends the hop a little early, never twice (``AckProbe`` counts a body
    once). Decoding the body to find its message id costs the session hop about a tenth of a
    millisecond per acknowledgement, which the unordered hop does not pay."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ran: set[str] = set()

    def ran(self, message_id: str) -> None:
        with self._lock:
            self._ran.add(message_id)

    def settled(self, body: str) -> bool:
        message_id = decode_signal(body).message_id
        with self._lock:
            return message_id in self._ran


class OrderCheck:
    """What the handler found out of order (each attempt's view: the session row and its
    state are one snapshot, so any fault is the protocol's, whichever attempt commits)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.faults: list[str] = []

    def follow(self, message: Ping, ctx: Context) -> None:
        """Check this message against the session state's last one; record it there."""
        session = ctx.session
        if session is None or session.sequence is None:
            self._fault(f"Ping {message.seq} arrived without a session or a number")
            return
        state = session.state
        last_sequence, last_seq = int(state.get("sequence", 0)), int(state.get("seq", -1))
        if session.sequence != last_sequence + 1 or message.seq <= last_seq:
            self._fault(f"session {session.key}: number {session.sequence} (Ping {message.seq})"
                        f" after {last_sequence} (Ping {last_seq})")
        state.update(sequence=session.sequence, seq=message.seq,
                     handled=int(state.get("handled", 0)) + 1)

    def _fault(self, text: str) -> None:
        with self._lock:
            self.faults.append(text)


def session_endpoints(runs: HandlerRuns, order: OrderCheck) -> list[Endpoint]:
    """``bench-a`` handles Ping in sessions: one state update, one Pong, the order checked.
    ``bench-b`` is declared so that Pong has a route; its queue collects them."""
    a, b = Endpoint(HOP_FROM), Endpoint(HOP_TO)

    @a.handles(Ping, partition=lambda m: m.key, session=lambda m: m.key, reads=counter_row)
    def ping(message: Ping, ctx: Context) -> None:
        runs.ran(ctx.message_id)
        order.follow(message, ctx)
        count_effect(ctx)
        ctx.send(Pong(seq=message.seq, key=message.key))

    @b.handles(Pong, partition=lambda m: m.key, reads=counter_row)
    def pong(message: Pong, ctx: Context) -> None:
        count_effect(ctx)

    return [a, b]


@dataclass
class HopRun:
    """One timed run of either hop."""

    variant: str
    index: int
    messages: int
    seconds: float
    ops: dict[OpKey, int]
    """The endpoint's port calls (scenario 5's count)."""
    client_requests: dict[OpKey, int]
    """HTTP requests of the producer threads: the client's sends (and counters)."""
    errors: dict[tuple[str, str, str], int]
    cpu: CpuUse
    outcomes: dict[str, int]
    slot_cache: dict[str, int]

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0

    @property
    def set_aside(self) -> int:
        return self.outcomes.get("deferred", 0)


def unordered_run(cfg: BenchConfig, index: int) -> HopRun:
    """Scenario 2 itself, on its own fresh Azurite."""
    return _eo_run("unordered", eo_hop.run(cfg), index)


def same_partitions_run(cfg: BenchConfig, index: int) -> HopRun:
    """Scenario 2 over the session hop's partitions (``cfg.sessions`` of them instead of
    ``cfg.partitions``): what the partitions alone change, without sessions."""
    return _eo_run("same_partitions", eo_hop.run(replace(cfg, partitions=cfg.sessions)), index)


def _eo_run(variant: str, result: ScenarioResult, index: int) -> HopRun:
    x = result.extra
    return HopRun(variant, index, result.units, result.seconds, x["ops"],
                  x["client_requests"], x["errors"], x["cpu"], x["outcomes"], x["slot_cache"])


def session_run(cfg: BenchConfig, index: int) -> HopRun:
    """The session hop on a fresh Azurite, checked."""
    if cfg.sessions < 1 or cfg.sessions % cfg.producers:
        raise BenchError(f"sessions: {cfg.sessions} sessions do not share out over "
                         f"{cfg.producers} producers (each session needs one producer)")
    runs, order = HandlerRuns(), OrderCheck()
    with installation(session_endpoints(runs, order), cfg.latency_ms) as inst:

        def send(seq: int) -> None:
            inst.client.send(Ping(seq=seq, key=session_key(seq, cfg.sessions),
                                  sent_at=time.time()))

        load = drive(inst, cfg, consume=[HOP_FROM], messages=cfg.messages, copies=1,
                     send=send, settled=runs.settled)
        verify(inst, cfg, load, order)
        slots = inst.bus.parts.receiver(HOP_FROM).slots
    return HopRun("sessions", index, cfg.messages, load.flow.seconds, load.ops,
                  load.client_requests, load.errors, load.cpu, dict(load.outcomes),
                  {"hits": slots.hits, "stale": slots.stale})


def expected_per_session(messages: int, sessions: int) -> dict[str, int]:
    expected: dict[str, int] = {}
    for seq in range(messages):
        key = session_key(seq, sessions)
        expected[key] = expected.get(key, 0) + 1
    return expected


def verify(inst: Installation, cfg: BenchConfig, load: LoadOutcome, order: OrderCheck) -> None:
    """Raise BenchError unless every Ping was handled once, in its session's order."""
    check_outcomes("sessions", load.outcomes, ("processed", "duplicate", "deferred"))
    if order.faults:
        raise BenchError(f"sessions: {len(order.faults)} messages out of order, e.g. "
                         f"{order.faults[:3]}")
    expected = expected_per_session(cfg.messages, cfg.sessions)
    names = inst.bus.names
    verify_counts(inst.plain.tables, names.state_table(HOP_FROM), expected)
    rows = {info.session: info.row for info in inst.bus.sessions(HOP_FROM).list()}
    wrong = {key: (row.state.get("handled"), row.state.get("sequence"), len(row.waiting))
             for key, row in rows.items()
             if (row.state.get("handled"), row.state.get("sequence"), len(row.waiting))
             != (expected.get(key), expected.get(key), 0)}
    if wrong or set(rows) != set(expected):
        raise BenchError(f"sessions: {len(wrong)} session rows wrong (handled, last number, "
                         f"waiting), e.g. {dict(list(wrong.items())[:3])}; "
                         f"{len(rows)} rows for {len(expected)} sessions")
    _, pongs = count_signals(inst.plain.queues, names.queue(HOP_TO))
    if pongs < cfg.messages:
        raise BenchError(f"sessions: only {pongs} Pong signals for {cfg.messages} hops")


def ops_per_message(runs: Sequence[HopRun], which: str) -> dict[OpKey, float]:
    """Port calls (``ops``) or client requests (``client_requests``) per message over
    ``runs``, empty receives left out."""
    total: dict[OpKey, int] = {}
    for r in runs:
        for key, n in getattr(r, which).items():
            total[key] = total.get(key, 0) + n
    messages = sum(r.messages for r in runs)
    return {key: n / messages for key, n in sorted(total.items()) if key != IDLE and n}


def summarize(runs: Sequence[HopRun]) -> dict[str, Any]:
    """The medians of each hop's msgs/s and of the rounds' ratios (a session run over the
    unordered runs of its round), operations per message over all runs of each hop, and the
    copies set aside."""
    by = {v: [r for r in runs if r.variant == v] for v in VARIANTS}
    out: dict[str, Any] = {}
    for base in ("unordered", "same_partitions"):
        ratios = ratios_to(by["sessions"], by[base])
        out[f"ratios_to_{base}"] = ratios
        out[f"ratio_to_{base}"] = statistics.median(ratios) if ratios else None
    for variant, mine in by.items():
        ops = ops_per_message(mine, "ops")
        client = ops_per_message(mine, "client_requests")
        out[variant] = {
            "msgs_per_s": statistics.median(r.rate for r in mine) if mine else None,
            "ops": ops, "ops_per_msg": sum(ops.values()) if mine else None,
            "client_per_msg": sum(client.values()) if mine else None,
            "messages": sum(r.messages for r in mine),
            "set_aside": sum(r.set_aside for r in mine)}
    return out


def ratios_to(runs: Sequence[HopRun], bases: Sequence[HopRun]) -> list[float]:
    """Each run's msgs/s over that of the base run of its round."""
    base = {r.index: r for r in bases}
    return [r.rate / base[r.index].rate for r in runs if r.index in base and base[r.index].rate]


def run(cfg: BenchConfig) -> ScenarioResult:
    runners = {"unordered": unordered_run, "same_partitions": same_partitions_run,
               "sessions": session_run}
    runs = alternating(
        cfg.session_rounds, VARIANTS, lambda variant, index: runners[variant](cfg, index),
        lambda done: (f"{done.rate:.1f} msgs/s ({done.messages} in {done.seconds:.1f} s; "
                      f"set aside {done.set_aside})"))
    summary = summarize(runs)
    timed = [r for r in runs if r.variant == "sessions"]
    return ScenarioResult(
        key=KEY, title=TITLE, units=sum(r.messages for r in timed),
        seconds=sum(r.seconds for r in timed),
        verified=(f"every partition's counter equals its Pings (exactly once), in "
                  f"{cfg.sessions} sessions; every session row handled its Pings numbered "
                  f"1 to n, none waiting; no copy out of order; a Pong per Ping; "
                  f"{summary['sessions']['set_aside']} copies set aside"),
        extra={"session_runs": runs, "session_summary": summary, "variants": NAMES,
               "sessions": cfg.sessions, "rounds": cfg.session_rounds})
