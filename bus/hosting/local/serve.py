"""``python -m bus host``: run a Functions app folder under the local host, until stopped or,
with ``until_idle``, until nothing is left to do."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bus.hosting.local.host import IDLE_LIMIT_SECONDS, Host


@contextlib.contextmanager
def without_auth_level_warning() -> Iterator[None]:
    """azure-functions warns, on every app without an HTTP function, that its auth level
    applies to nothing - the normal case for a bus app, and nothing for its developer to act
    on."""
    def alarming(record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Auth level is not applied")

    root = logging.getLogger()
    root.addFilter(alarming)
    try:
        yield
    finally:
        root.removeFilter(alarming)


class StillBusy(Exception):
    """``until_idle`` found work coming for ``IDLE_LIMIT_SECONDS``."""


def serve(script_root: Path, *, until_idle: bool = False, timer_seconds: float | None = None,
          lease_seconds: float | None = None, stats_file: Path | None = None,
          log_level: str = "INFO") -> dict[str, Any]:
    """Load ``script_root``'s function_app.py into Microsoft's worker and feed its triggers
    (``Host``) until SIGINT or SIGTERM - or, with ``until_idle``, until every trigger is
    idle. Returns the host's counters (``Host.stats``), also written to ``stats_file``."""
    logging.basicConfig(level=log_level, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("azure").setLevel(logging.WARNING)
    logging.getLogger("urllib3").setLevel(logging.ERROR)  # "pool is full": harmless here
    host = Host.create(script_root.resolve(), timer_seconds=timer_seconds,
                       lease_seconds=lease_seconds, until_idle=until_idle)
    with without_auth_level_warning():
        asyncio.run(_serve(host))
    stats = host.stats()
    if stats_file is not None:
        stats_file.write_text(json.dumps(stats, indent=2))
    if host.still_busy:
        raise StillBusy(f"not idle after {IDLE_LIMIT_SECONDS:.0f} s: messages kept coming "
                        "(handlers that keep sending each other?) or storage did not answer "
                        "(see the log); run the host without --until-idle")
    return stats


async def _serve(host: Host) -> None:
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, host.stop.set)
    await host.run()
