"""``python -m bench``: run the scenarios, write the results file, print the JSON.

    python -m bench                    # full run (about 13 minutes): bench/results/latest.md
    python -m bench --quick            # about 3 minutes: bench/results/quick.md
    python -m bench --only raw,eo_hop  # some scenarios (the others report null)
    python -m bench --latency-ms 0     # against Azurite directly (default: 5 ms per request)
    python -m bench --only spark --spark-rows 4000 --spark-runs 3   # Spark writes only
    python -m bench --only sessions --session-rounds 3   # ordered sessions vs unordered hop
    python -m bench --only tracing --tracing-rounds 3    # the hop, tracing off vs SDK on

The last line printed is the JSON summary. The exit code is 1 when any scenario failed (it
reports null instead of a number), 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

from bench import machine, prices, report
from bench.config import FULL, QUICK
from bench.emulator import round_trips
from bench.harness import BenchError, ScenarioResult, progress
from bench.scenarios import SCENARIOS, runner

RESULTS = Path(__file__).resolve().parent / "results"


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer messages, about 3 minutes")
    parser.add_argument("--messages", type=int, help="messages per throughput scenario")
    parser.add_argument("--latency-ms", type=float,
                        help="milliseconds added to every storage request by the delay proxy "
                             "(default 5; 0: Azurite directly)")
    parser.add_argument("--concurrency", type=int,
                        help="consumer threads of raw and kombu (at most 10 advised)")
    parser.add_argument("--loops", type=int,
                        help="leasing loops per endpoint of the bus scenarios (default 1)")
    parser.add_argument("--producers", type=int, help="producer threads")
    parser.add_argument("--latency-seconds", type=float, help="length of the latency run")
    parser.add_argument("--spark-rows", type=int, help="rows per timed Spark write")
    parser.add_argument("--spark-runs", type=int, help="timed runs of each Spark write per "
                                                       "setting (alternating)")
    parser.add_argument("--spark-cores", type=lambda text: tuple(int(n) for n in text.split(",")),
                        help="Spark settings local[n], comma-separated (default 1,2; quick 2)")
    parser.add_argument("--sessions", type=int,
                        help="sessions of the sessions scenario (a multiple of the producers; "
                             "default 64)")
    parser.add_argument("--session-rounds", type=int,
                        help="rounds of the sessions scenario (unordered and session hop "
                             "alternating; default 2)")
    parser.add_argument("--tracing-rounds", type=int,
                        help="rounds of the tracing scenario (the hop with tracing off and "
                             "on, alternating; default 3, quick 1)")
    parser.add_argument("--only", help=f"comma-separated subset of {','.join(SCENARIOS)}")
    parser.add_argument("--log", type=Path, help="write the bus's INFO log to this file "
                                                 "(to see why a scenario failed)")
    parser.add_argument("--out", type=Path, help="results file (default: bench/results/"
                                                 "latest.md, or quick.md with --quick)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    cfg = QUICK if args.quick else FULL
    overrides = {"messages": args.messages, "latency_ms": args.latency_ms,
                 "concurrency": args.concurrency, "loops": args.loops,
                 "producers": args.producers, "latency_seconds": args.latency_seconds,
                 "spark_rows": args.spark_rows, "spark_runs": args.spark_runs,
                 "spark_cores": args.spark_cores, "sessions": args.sessions,
                 "session_rounds": args.session_rounds,
                 "tracing_rounds": args.tracing_rounds}
    cfg = replace(cfg, **{k: v for k, v in overrides.items() if v is not None})
    keys = list(SCENARIOS) if not args.only else [k.strip() for k in args.only.split(",")]
    unknown = set(keys) - set(SCENARIOS)
    if unknown:
        print(f"unknown scenarios {sorted(unknown)}; choose from {list(SCENARIOS)}")
        return 2
    out = args.out or RESULTS / ("quick.md" if cfg.quick else "latest.md")
    logging.getLogger("azure").setLevel(logging.WARNING)
    if args.log:
        logging.basicConfig(filename=args.log, level=logging.INFO,
                            format="%(asctime)s %(threadName)s %(name)s %(message)s")
        logging.getLogger("azure").setLevel(logging.WARNING)
    table = prices.load()
    started, clock = datetime.now(timezone.utc), time.monotonic()
    progress(f"bench: {'quick' if cfg.quick else 'full'} run, {cfg.messages} messages, "
             f"{cfg.concurrency} consumer threads (the bus: {cfg.loops} leasing loop(s) per "
             f"endpoint), {cfg.producers} producers; "
             f"scenarios {', '.join(keys)}")
    trips = round_trips(cfg.latency_ms) if cfg.latency_ms > 0 else None
    if trips is not None:
        progress(f"bench: a storage request takes {trips[0]:.1f} ms to Azurite, {trips[1]:.1f} "
                 f"ms through the delay proxy ({cfg.latency_ms:g} ms added: Azure's 5-10 ms)")
    results: dict[str, ScenarioResult] = {}
    failures: dict[str, str] = {}
    for number, key in enumerate(SCENARIOS, 1):
        if key not in keys:
            continue
        title = SCENARIOS[key][1]
        progress(f"[{number}/{len(SCENARIOS)}] {title}: starting on a fresh Azurite")
        begun, load_before = time.monotonic(), machine.load_average()
        try:
            result = runner(key)(cfg)
        except BenchError as exc:
            failures[key] = f"FAILED: {exc}"
            progress(f"[{number}/{len(SCENARIOS)}] {title}: FAILED: {exc}")
            continue
        result.extra["load"] = f"{load_before} -> {machine.load_average()}"
        results[key] = result
        progress(f"[{number}/{len(SCENARIOS)}] {title}: {result.rate:.1f} per s "
                 f"({result.units} in {result.seconds:.1f} s; scenario "
                 f"{time.monotonic() - begun:.0f} s with Azurite); checked: {result.verified}")
    info = report.RunInfo(cfg=cfg, machine=machine.describe(),
                          started=started.strftime("%Y-%m-%d %H:%M UTC"),
                          round_trips=trips,
                          seconds=time.monotonic() - clock,
                          command="python -m bench " + " ".join(sys.argv[1:] if argv is None
                                                                else argv))
    data = report.summary(results, table, cfg, info.machine["commit"])
    titles = {key: SCENARIOS[key][1] for key in SCENARIOS}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report.markdown(info, results=results, failures=failures,
                                         titles=titles, data=data, prices=table))
    progress(f"bench: wrote {out} ({info.seconds:.0f} s in all)")
    print(json.dumps(data), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
