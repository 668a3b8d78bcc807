"""Command line of the simulation. The last line printed is a JSON summary."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import time
from collections import Counter

from bus.protocol.safeguards import BREAKS, Safeguards
from bus.testing.simulate import surface
from bus.testing.simulate.quickseed import quick_failing_seed
from bus.testing.simulate.run import PURGING_BREAKS, run_once

_SHOWN_FAILURES = 5
EXERCISED = ("functions_deliveries", "invocations_in_shared_rounds", "functions_requeued",
             "functions_postponed",
             "host_poisoned",
             "orchestrations_started", "orchestrations_repeated", "orchestrations_never_run",
             "poisoned_replayed", "alerted_replays", "presumed_orphans", "skewed_processes",
             "deferred_again", "early_copies_put_back", "spark_jobs", "spark_task_attempts",
             "spark_rows_published", "spark_batches", "spark_batches_replayed",
             "spark_batch_reads", "spark_batch_reads_failed", "spark_batch_reads_refused",
             "expiring_host_copies", "session_messages", "sessions_set_aside",
             "sessions_closed", "gaps_skipped", "sessions_refused", "overdue_releases",
             "briefs", "briefs_near_inline", "fan_outs_committed", "fan_outs_too_large",
             "maintenance_outages", "sessions_closed_at_set_aside", "audited_actions")
"""How often each entry point beside the polling worker ran (bus.testing.simulate.functions, with
the invocations that shared a claim round with concurrent ones and the messages a failed
handler's retry delay postponed, and .spark: write jobs with
their task attempts, the rows they published, a streaming query's micro-batches and the ones it
ran again after a restart, batch reads with those that failed and those refused - their run key
committed, or given up by a later read), the operator's replays (the entries it replayed, and
the passes it made at once, alerted to a new entry), how many live tokens the sweeper poisoned
as presumed orphans (their messages processed all the same when their signals came), the worker
processes whose clocks were off, the messages deferred again after a release, and the copies
that arrived before they were due (a delay longer than the queue allows, or a skewed clock) and
were put back until due, and the host's poison copies sent with a time-to-live (each must be
adopted before it runs out: ``expired_messages``, beside, counts those that ran out at all,
after their adoption). For the runs with sessions (endpoint ``s``): the Tallies handled, those
of them that had been set aside until their turn, the sessions closed, the gaps skipped, the
copies poisoned because their session had skipped their number, and the waiting copies
maintenance released once their gap outlasted the reorder window. For the runs with Briefs
(``bus.testing.simulate.briefs``): the Briefs sent, those whose payload was within a few hundred
bytes of what a signal carries inline, and the fan-outs near an outbox record's limit that
committed and that were a few bytes over it. The runs whose maintenance stopped for longer than
the host's poison copies live (``run.Outage``)."""


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    quiet = logging.getLogger("bus")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # faults are the point; keep quiet
    try:
        return _run(args)
    finally:
        quiet.setLevel(level)  # called as a function (a test), the caller's logging is back


def _run(args: argparse.Namespace) -> int:
    if args.list_breaks:
        for name, (_, description) in BREAKS.items():
            print(f"{name:20} {description}")
        return 0
    if args.every_break:
        return _search_every_break(args.seed, args.runs, args.progress)
    safeguards = BREAKS[args.break_name][0] if args.break_name else Safeguards()
    if args.quick_seed is not None:
        return _quick_seed(args, safeguards)
    listed = _surface_listed() if args.surface else None
    drove: Counter[str] = Counter()
    with surface.counting(drove) if listed is not None else contextlib.nullcontext(drove):
        summary = _run_seeds(args, safeguards, drove)
    if listed is not None:
        summary["surface"] = {operation: drove[operation] for operation in listed}
        summary["undriven"] = [operation for operation in listed if not drove[operation]]
    print(json.dumps(summary))
    return 1 if summary["violations"] and not args.break_name else 0


def _surface_listed() -> list[str]:
    """The public operations (``bus.testing.simulate.surface``); the dashboard's routes need
    its web stack."""
    try:
        return surface.operations()
    except ImportError as exc:
        raise SystemExit(f"--surface lists the dashboard's API routes too, which needs its web "
                         f"stack ({exc.name} is missing): pip install 'eobus[dashboard]'") from exc


def _run_seeds(args: argparse.Namespace, safeguards: Safeguards,
               drove: Counter[str]) -> dict[str, object]:
    totals: Counter[str] = Counter()
    statistics: Counter[str] = Counter()
    messages = violations = 0
    failing: list[int] = []
    started = time.monotonic()
    for index in range(args.runs):
        seed = args.seed + index
        result = run_once(seed, safeguards, routes=drove)
        messages += result.messages
        totals.update(result.faults)
        statistics.update(result.statistics)
        if result.violations:
            violations += len(result.violations)
            failing.append(seed)
            if len(failing) <= _SHOWN_FAILURES:
                _report(seed, args.break_name, result.violations)
            if args.stop_at_first:
                print(f"first violation at seed {seed}")
                break
        if args.progress and (index + 1) % max(1, args.runs // 10) == 0:
            print(f"... {index + 1}/{args.runs} runs, {violations} violations, "
                  f"{time.monotonic() - started:.0f} s", file=sys.stderr)
    return {
        "runs": index + 1 if args.runs else 0, "seed": args.seed, "break": args.break_name,
        "messages": messages, "faults_injected": sum(totals.values()),
        "faults_by_kind": dict(sorted(totals.items())), "violations": violations,
        "failing_runs": len(failing), "failing_seeds": failing[:20],
        "slot_cache": {"hits": statistics["hits"], "stale": statistics["stale"]},
        "bundled_signals": statistics["bundled"],
        "grouped_sends": {"grouped": statistics["grouped"], "repaired": statistics["repaired"]},
        "exercised": {name: statistics[name] for name in EXERCISED},
        "expired_messages": statistics["expired_messages"],
        "seconds": round(time.monotonic() - started, 1)}


def _search_every_break(first: int, runs: int, progress: bool) -> int:
    """Each break's first failing seed within ``runs`` runs from ``first``: one line per break,
    then the JSON summary; 1 when a break fails no run (its safeguard is not shown needed)."""
    found: dict[str, int | None] = {}
    started = time.monotonic()
    for name, (safeguards, _) in BREAKS.items():
        purging = name in PURGING_BREAKS
        seed = next((seed for seed in range(first, first + runs)
                     if run_once(seed, safeguards, purging=purging).violations), None)
        found[name] = seed
        print(f"{name:24} " + (f"first failing seed {seed}" if seed is not None
                                else f"NO violation in {runs} runs from seed {first}"))
        if progress:
            print(f"... {len(found)}/{len(BREAKS)} breaks, {time.monotonic() - started:.0f} s",
                  file=sys.stderr)
    unfound = [name for name, seed in found.items() if seed is None]
    print(json.dumps({"runs": runs, "seed": first, "first_failing_seeds": found,
                      "unfound": unfound, "seconds": round(time.monotonic() - started, 1)}))
    return 1 if unfound else 0


def _quick_seed(args: argparse.Namespace, safeguards: Safeguards) -> int:
    if not args.break_name:
        raise SystemExit("--quick-seed looks for a break's failing seed: name it with --break")
    seeds = range(args.seed, args.seed + args.runs)
    seed, slow = quick_failing_seed(safeguards, seeds, args.quick_seed,
                                    purging=args.break_name in PURGING_BREAKS)
    print(f"{args.break_name}: " + (f"first seed failing within {args.quick_seed:g} s: {seed}"
                                    if seed is not None else "none fails that quickly"))
    print(json.dumps({"break": args.break_name, "seed": seed, "passed_over_slow": slow,
                      "within_seconds": args.quick_seed, "runs": args.runs,
                      "first": args.seed}))
    return 0 if seed is not None else 1


def _report(seed: int, break_name: str | None, violations: list[str]) -> None:
    again = f" --break {break_name}" if break_name else ""
    print(f"run with seed {seed} broke {len(violations)} invariant(s); reproduce with: "
          f"python -m bus.testing.simulate --runs 1 --seed {seed}{again}")
    for violation in violations[:10]:
        print(f"  - {violation}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bus.testing.simulate",
        description="Run the exactly-once protocol against injected faults and check it.")
    parser.add_argument("--runs", type=int, default=100, help="number of runs (default 100)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the first run")
    parser.add_argument("--break", dest="break_name", choices=sorted(BREAKS),
                        help="disable one safeguard (the run must then find violations)")
    parser.add_argument("--list-breaks", action="store_true", help="name the breaks and exit")
    parser.add_argument("--every-break", action="store_true",
                        help="for each break, the first of --runs seeds that fails (exit 1 when "
                             "a break fails none)")
    parser.add_argument("--progress", action="store_true", help="progress on stderr")
    parser.add_argument("--surface", action="store_true",
                        help="count how often the runs drove each public operation (listed "
                             "from the code: bus.testing.simulate.surface); the summary's "
                             "\"surface\" maps each to its count, \"undriven\" lists those at 0")
    parser.add_argument("--quick-seed", type=float, metavar="SECONDS",
                        help="with --break: the first of --runs seeds whose run fails within "
                             "SECONDS of wall time, passing over slower runs (each run in a "
                             "process of its own: POSIX only); exit 1 when none does")
    parser.add_argument("--stop-at-first", action="store_true",
                        help="stop after the first run that breaks an invariant (its seed is "
                             "printed)")
    return parser


if __name__ == "__main__":
    sys.exit(main())
