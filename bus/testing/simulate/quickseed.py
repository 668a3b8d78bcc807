"""The first seed at which a broken run fails quickly: what a test keeps as the break's known
seed (``tests/sim/test_simulation.py``, ``FAILING_SEED``).

A broken run can take a minute or more when the break keeps it from ever quiescing; the known
seeds run in every ``make check`` and ``make test``, so the seed kept is the first whose run
shows a violation within a few seconds. Each run goes in a forked child, killed once past the
limit (an abandoned run cannot be stopped from inside: its actors are greenlets). POSIX only.
"""

from __future__ import annotations

import os
import signal
import time

from bus.protocol.safeguards import Safeguards
from bus.testing.simulate.run import run_once

_POLL = 0.02
_VIOLATED, _HELD = 1, 0


def quick_failing_seed(safeguards: Safeguards, seeds: range, seconds: float, *,
                       purging: bool = False) -> tuple[int | None, int]:
    """The first of ``seeds`` whose run with ``safeguards`` shows a violation within
    ``seconds`` of wall time (None if none does), and how many runs were passed over as slow.
    ``purging``: runs of the focused workload (``run_once``)."""
    slow = 0
    for seed in seeds:
        outcome = _run_within(safeguards, seed, seconds, purging)
        if outcome is None:
            slow += 1
        elif outcome == _VIOLATED:
            return seed, slow
    return None, slow


def _run_within(safeguards: Safeguards, seed: int, seconds: float,
                purging: bool = False) -> int | None:
    """The run's exit status (violated or held), None when it took longer than ``seconds``."""
    started = time.monotonic()
    child = os.fork()
    if child == 0:  # the run, in a process of its own
        status = 2
        try:
            status = (_VIOLATED if run_once(seed, safeguards, purging=purging).violations
                      else _HELD)
        finally:
            os._exit(status)
    while True:
        done, status = os.waitpid(child, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() - started > seconds:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
            return None
        time.sleep(_POLL)
