"""The simulation holds with every safeguard on, and fails when any one is off.

Three sizes (docs/testing.md): ``make check`` runs a fixed handful of seeds that between them
inject every kind of fault and every session event, and each break at a seed known to fail;
``make test`` adds the slice of seeds that follows the commit (``tests/sim/seeds.py``);
``make test-all`` runs 2,000 seeds and searches each break's first failing seed among 300
(``python -m bus.testing.simulate --every-break``).
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from dataclasses import fields

import pytest

from bus.protocol.safeguards import BREAKS, Safeguards
from bus.testing.simulate import __main__ as simulate_cli
from bus.testing.simulate import run_once
from bus.testing.simulate.run import PURGING_BREAKS
from bus.testing.simulate.world import Actor, FaultProfile, World

pytestmark = pytest.mark.sim

FAILING_SEED = {
    "ack-before-commit": 1,
    "ack-bundle-early": 30,
    "act-on-unfinished": 77,
    "admit-reserved-keys": 16,
    "commit-over-unfinished": 6,
    "dirty-retry": 1,
    "drop-presumed-orphans": 1,
    "duplicate-entries": 15,
    "expire-before-claim": 33,
    "expire-on-stale-slot": 1323,
    "forget-sent": 3,
    "keep-failed-reads": 5,
    "mark-apart": 6,
    "note-before-signal": 8,
    "numbers-before-room": 532,
    "payload-before-token": 480,
    "poisoned-ends-deferral": 187,
    "purge-around-poisoning": 49,
    "purge-unsettled": 152,
    "release-any-deferral": 20,
    "release-before-commit": 86,
    "resend-without-swap": 4,
    "reuse-attempt-ids": 13,
    "reuse-send-ids": 13,
    "session-apart": 2,
    "settle-before-stage": 59,
    "settle-reads-early": 41,
    "skip-claim-cas": 3,
    "skip-confirm": 1,
    "skip-fence-superseded": 3,
    "skip-origin-check": 1,
    "skip-origin-fence": 62,
    "skip-sequence-check": 2,
    "skip-token-check": 4,
    "skip-unfinished-commits": 35,
    "split-claim-read": 121,
    "steps-by-message-id": 151,
    "unmarked-sends": 20,
    "unreserved-growth": 4,
}
"""A seed at which each break fails: the first among the first 300 whose broken run fails within 5
seconds (``python -m bus.testing.simulate --break NAME --runs 300 --quick-seed 5``; a broken run
can take minutes when the break keeps it from quiescing, and these run in every ``make check``
and ``make test``) - but the slow ones ``SLOW_BREAKS`` names. ``expire-on-stale-slot`` needs
two copies of one message to cross its expiry on a stale slot, which the workload seldom
arranges: its seed is the first that fails among the runs with Briefs that expire within 10 s
and skewed clocks (fast since the Functions hosts postpone a failed handler's message for
its retry delay; before, its failing runs did not quiesce): 1323 since the health reads moved
the interleavings (none of the first 1,000 fails within 5 s, nor of the filtered ones within
10 s);
``tests/protocol/test_expiry_after_commit.py`` shows that break failing every time.
``purge-around-poisoning`` needs the operator's purge to fall between a poisoning's entry and
its token write: its seed is a run of the focused workload (``PURGING`` below;
``tests/operations/test_poisoned.py`` shows it every time);
``payload-before-token``, the sweeper between a copy's blob and its token: none of the first
300 fails within 60 s, 480 is the first after (``--seed 301 --quick-seed 60``);
``numbers-before-room``, a numbered send refused at a full queue: none of the first 300 fails
within 5 s, 532 is the first after (``--runs 1000 --quick-seed 5``). A change
to the protocol or the simulation moves interleavings, so a seed here can stop failing: the
same command finds one again, and ``make test-all`` checks that every break still fails
within 1,500 runs (``--every-break``)."""

COVERING_SEEDS = (*range(1, 19), 44, 56, 131)
"""Seeds that between them inject every kind of fault and reach every session event (found by
running seeds from 1 until all were seen: 1 to 18 reach all but a refused session, which seed
44 is the first to reach, and an overdue release, seed 56 - and, on Python 3.10, where the
console's operator has no dashboard and takes other turns, the refused session at seed 131).
Each is a test of its own, so the developer's loop spreads them over its workers."""

COVERING_SEED = 131
"""The one of ``COVERING_SEEDS`` that alone injects every kind of fault and reaches every
session event, on Python 3.13 and on 3.10 (found by trying each)."""


@pytest.mark.sim_long
@pytest.mark.parametrize("seed", [seed for seed in COVERING_SEEDS if seed != COVERING_SEED])
def test_the_protocol_holds_at_the_covering_seeds(seed: int) -> None:
    """In ``make test``: ``COVERING_SEED`` alone covers what they cover together, and runs in
    the developer's loop (the next test)."""
    assert run_once(seed).violations == []


def test_one_run_injects_every_kind_of_fault_and_reaches_every_session_event() -> None:
    result = run_once(COVERING_SEED)
    assert result.violations == []
    faults = {kind.split(":")[0] for kind in result.faults}
    assert faults >= {"fail_before", "fail_after", "ghost", "duplicate_signal", "crash",
                      "lease_expiry"}
    assert all(result.statistics[name] for name in (
        "session_messages", "sessions_set_aside", "sessions_closed", "gaps_skipped",
        "sessions_refused", "overdue_releases")), result.statistics


@pytest.mark.sim_slice
def test_the_protocol_holds_on_the_commits_seeds(commit_seeds: range) -> None:
    failing = [(seed, result.violations[:3]) for seed in commit_seeds
               if (result := run_once(seed)).violations]
    assert failing == [], ("violations; replay one with "
                           "python -m bus.testing.simulate --runs 1 --seed S")


FOUND_SEEDS = {
    756838522: "the operator at the console paused s for a deployment again on every restart "
               "after a crash: an instance of s whose clock is slow stayed paused for good, "
               "while the copies its trigger put back meanwhile multiplied on send faults",
    30281: "the operator at the console purged every entry of t; one entry was written while "
           "the command ran, so neither its listing before nor after showed it, and the "
           "message purged with it counted as lost (it now reads the purge's audit records)",
    87307767: "a session copy counted as left waiting for good a minute after its reorder "
              "window, though every maintenance pass of that minute had failed on faults (the "
              "check now waits for a pass that moved the sessions on)",
    87307801: "an instance of t whose clock ran slow saw the operator's short pauses last 20 s "
              "longer, and the copies its invocations put back doubled on lost sends until the "
              "step budget ran out (the trigger now waits out a pause of at most 30 s)",
    87307873: "a replay of every entry of t made one's token live, then failed; the operator "
              "had decided to leave that entry, and nothing would signal the live token (a "
              "replay now writes its signal on the token, and the sweeper sends it again)",
    2062: "during a maintenance outage an adoption failed on one of the host's poison copies "
          "and left the others it had leased hidden, so the next reader missed them and they "
          "expired (what an adoption did not adopt is now released at once)",
    594864499: "with 16 % of storage calls failing, maintenance's adoption leased t's poison "
               "queue every second, and its receives whose answers were lost kept the entry "
               "the operator was purging hidden beyond the step budget (an adoption with "
               "nothing to adopt now only peeks)",
    510: "a Brief's fan-out was too large on every delivery (50 allowed): the Functions "
         "trigger then put a copy back for each retry delay, a copy whose send failed left "
         "the original to come back too, and one Brief became 2,878 copies (the function "
         "now postpones the message itself, on the host's lease)",
    488: "the operator purged every entry of t while a Brief's entry was being written; the "
         "purge took it and deleted its token, but the message's sender had fenced an earlier "
         "attempt's token, and the console, seeing a token of the message left, did not count "
         "it as purged (fences no longer count)",
    513: "the operator purged every entry of t between a poisoning's entry and its token "
         "write: the purge found the token live and left it, the poisoning then poisoned it, "
         "and the token and its payload stayed with no entry to replay or purge them (a "
         "purge now poisons such a token itself first; break purge-around-poisoning)",
}
"""Seeds that once failed (a commit's slice in CI, or a batch of runs), with what went wrong -
the simulation's checks, or a liveness hole of the code's that left no message lost but one
waiting for an operator: they hold since."""


@pytest.mark.sim_long
@pytest.mark.parametrize("seed", sorted(FOUND_SEEDS))
def test_seeds_a_slice_once_failed_on_hold(seed: int) -> None:
    assert run_once(seed).violations == [], FOUND_SEEDS[seed]


SLOW_BREAKS = {"payload-before-token", "poisoned-ends-deferral", "purge-unsettled",
               "unreserved-growth"}
"""Breaks none of whose first 300 seeds fails within 5 s (their broken runs run on until the
step limit), checked by ``make test`` (``sim_long``), not in the developer's loop. The known
seeds of payload-before-token and poisoned-ends-deferral are the first failing within 60 s
(``--quick-seed 60``; payload-before-token's past the first 300, above); unreserved-growth
keeps an earlier one (about 40 s). purge-unsettled fails seldom: it needs a purge of a
message whose handler committed while its sends waited for room. Its broken runs do not
quiesce: among the runs with Briefs and a bounded queue, the first two passed over as slow at
25 s fail when run to the end (152 and 286, in about 85 s and 70 s with the machine busy;
since the health reads moved the interleavings, 286 holds and 152 fails in about 50 s: 152 is
kept; 602 fails too). A deterministic test shows purge-unsettled failing every time
(``tests/protocol/test_expiry_after_commit.py``)."""


PURGING = PURGING_BREAKS
"""Breaks whose known seed is a run of the focused workload ``run_once(purging=True)``: an
operator who purges ``t``'s poison queue every few tenths of a second. The race this break
opens - a purge between a poisoning's entry and its token write - needs the purge to land in
that moment; the ordinary operator did at seed 513 until the health reads moved the
interleavings, and no run of the first 2,000 (nor of the runs with Briefs up to 6,000) met it
since. Focused, seed 49 fails (its payload blob left behind, the token poisoned with no entry)
and holds with the safeguard."""


def test_the_focused_workload_holds_with_every_safeguard() -> None:
    assert run_once(FAILING_SEED["purge-around-poisoning"], purging=True).violations == []


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.sim_long)
                                  if name in SLOW_BREAKS else name for name in sorted(BREAKS)])
def test_each_break_fails_at_its_known_seed(name: str) -> None:
    # The operator at the console acts through the dashboard too: without its web stack (the
    # Python 3.10 tests) it takes the other ways, and a run takes other turns than here.
    pytest.importorskip("fastapi", reason="the known seeds are those of runs with the dashboard")
    seed = FAILING_SEED.get(name)
    assert seed is not None, (
        f"break {name} has no known failing seed: find it with `python -m "
        f"bus.testing.simulate --break {name} --runs 300 --quick-seed 5` and add it to "
        "FAILING_SEED")
    assert run_once(seed, BREAKS[name][0], purging=name in PURGING).violations, (
        f"break {name} no longer fails at seed {seed}: the interleavings moved. Find its first "
        f"failing seed with `python -m bus.testing.simulate --break {name} --runs 300 "
        "--quick-seed 5` and update FAILING_SEED; if none fails within 300 runs, the "
        "simulation no longer shows this safeguard is needed")


def test_every_known_seed_names_a_break() -> None:
    assert set(FAILING_SEED) == set(BREAKS)
    assert all(seed <= 1500 for seed in FAILING_SEED.values())  # make test-all's search
    assert {name for name, seed in FAILING_SEED.items() if seed > 300} <= {
        "expire-on-stale-slot", "steps-by-message-id", "purge-unsettled", "payload-before-token",
        "purge-around-poisoning", "numbers-before-room"}  # named in its doc


def test_runs_replay_exactly_from_their_seed() -> None:
    first, second = run_once(42), run_once(42)
    assert (first.faults, first.steps, first.violations) == (
        second.faults, second.steps, second.violations)


def test_runs_do_not_depend_on_the_wall_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    # A reading by the wall's clock (a statistics window crossing midnight, say) changes how
    # many storage calls a run makes, so its faults, so its interleavings: a known seed would
    # then fail or pass by the time of day. Seed 3 is a run with the operator's console.
    real_monotonic = time.monotonic
    started = real_monotonic()
    results = []
    for wall in (1_767_225_600 + 600, 1_767_268_800):  # 2026-01-01 at 00:10 and at 12:00 UTC
        monkeypatch.setattr(time, "time", lambda wall=wall: wall + real_monotonic() - started)
        monkeypatch.setattr(time, "monotonic", lambda wall=wall: wall + real_monotonic())
        result = run_once(3)
        results.append((result.faults, result.steps, result.violations))
    assert results[0] == results[1]


def test_an_actor_that_dies_of_an_exception_is_a_violation() -> None:
    # A bug that escapes a worker, a host or the client must fail its run, not the process
    # running the simulation (nor be lost with the actor).
    world = World(1, FaultProfile())

    def doomed() -> None:
        raise ValueError("a bug")

    world.spawn(Actor("doomed", doomed))
    assert world.run(lambda: True, lambda: False, lambda: None, max_steps=100)
    assert world.deaths == ["doomed died: ValueError: a bug"]


def test_command_line_prints_a_json_summary_last() -> None:
    # Seeds 2 and 3: both broken runs end within seconds (3 is the break's known seed; 4's
    # runs on to the step limit, 40 s), so the summary's violations branch is seen too.
    out = subprocess.run([sys.executable, "-m", "bus.testing.simulate", "--runs", "2",
                          "--seed", "2", "--break", "forget-sent"],
                         capture_output=True, text=True, check=True).stdout
    summary = json.loads(out.strip().splitlines()[-1])
    assert {"runs", "messages", "faults_injected", "violations"} <= set(summary)
    assert summary["runs"] == 2 and summary["break"] == "forget-sent"
    if summary["violations"]:
        assert "reproduce with: python -m bus.testing.simulate --runs 1 --seed" in out


def test_every_break_search_names_each_breaks_first_failing_seed(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``--every-break`` (what ``make test-all`` runs with 300), here over seed 1 and two
    breaks: one that fails there and one that does not, so both lines and the exit status are
    seen."""
    chosen = {name: BREAKS[name] for name in ("ack-before-commit", "skip-origin-fence")}
    monkeypatch.setattr(simulate_cli, "BREAKS", chosen)
    status = simulate_cli.main(["--every-break", "--runs", "1", "--seed", "1"])
    out = capsys.readouterr().out
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["first_failing_seeds"] == {"ack-before-commit": 1, "skip-origin-fence": None}
    assert summary["unfound"] == ["skip-origin-fence"] and status == 1
    assert "ack-before-commit        first failing seed 1" in out
    assert "skip-origin-fence        NO violation in 1 runs from seed 1" in out
    # Quiet while it runs, and the caller's logging as it was afterwards: a later test in the
    # same process still sees the bus's warnings.
    assert logging.getLogger("bus").level == logging.NOTSET


def test_quick_seed_finds_the_first_seed_failing_within_the_limit_and_passes_over_slow_runs(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``--quick-seed`` (how ``FAILING_SEED`` is found): ack-before-commit fails at seed 1 in
    about a second; with a limit no run can meet, every run is passed over as slow."""
    args = ["--break", "ack-before-commit", "--runs", "2", "--seed", "1", "--quick-seed"]
    assert simulate_cli.main([*args, "60"]) == 0
    found = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (found["seed"], found["passed_over_slow"]) == (1, 0)
    assert simulate_cli.main([*args, "0.001"]) == 1
    out = capsys.readouterr().out
    assert "ack-before-commit: none fails that quickly" in out
    assert json.loads(out.strip().splitlines()[-1])["passed_over_slow"] == 2
    with pytest.raises(SystemExit, match="name it with --break"):
        simulate_cli.main(["--quick-seed", "5"])


def test_list_breaks_names_the_required_ones() -> None:
    out = subprocess.run([sys.executable, "-m", "bus.testing.simulate", "--list-breaks"],
                         capture_output=True, text=True, check=True).stdout
    names = {line.split()[0] for line in out.splitlines()}
    assert names >= {"skip-claim-cas", "reuse-attempt-ids", "ack-before-commit",
                     "skip-token-check", "skip-sequence-check", "session-apart",
                     "release-before-commit"}


def test_every_safeguard_has_a_break() -> None:
    """Each switch in ``Safeguards`` is turned off by exactly one break."""
    switched = {field.name for safeguards, _ in BREAKS.values() for field in fields(Safeguards)
                if not getattr(safeguards, field.name)}
    assert switched == {field.name for field in fields(Safeguards)}
    assert len(BREAKS) >= 16
