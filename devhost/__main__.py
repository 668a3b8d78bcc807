"""python -m devhost [--script-root DIR] [--timer-seconds S]: run the function app locally."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
from pathlib import Path

from devhost.host import Host


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m devhost", description=__doc__)
    parser.add_argument("--script-root", type=Path, default=Path("."),
                        help="folder with function_app.py and host.json (default: .)")
    parser.add_argument("--timer-seconds", type=float, default=None,
                        help="run timer triggers this often instead of their schedule")
    parser.add_argument("--stats-file", type=Path, default=None,
                        help="write invocation counters here (JSON) when stopping")
    parser.add_argument("--lease-seconds", type=float, default=None,
                        help="queue message lease (the host's is 600 s; tests shorten it)")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args()
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("azure").setLevel(logging.WARNING)
    logging.getLogger("urllib3").setLevel(logging.ERROR)  # "pool is full": harmless here
    host = Host.create(args.script_root.resolve(), timer_seconds=args.timer_seconds,
                       lease_seconds=args.lease_seconds)
    asyncio.run(_serve(host))
    if args.stats_file is not None:
        args.stats_file.write_text(json.dumps(host.stats(), indent=2))


async def _serve(host: Host) -> None:
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, host.stop.set)
    await host.run()


if __name__ == "__main__":
    main()
