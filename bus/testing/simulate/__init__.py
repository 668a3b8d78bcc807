"""Deterministic simulation of the protocol under injected faults.

    python -m bus.testing.simulate --runs 2000 --seed 1
    python -m bus.testing.simulate --list-breaks
    python -m bus.testing.simulate --runs 300 --seed 1 --break skip-claim-cas

Needs the ``testing`` extra (greenlet).
"""

from bus.testing.simulate.run import RunResult, run_once

__all__ = ["RunResult", "run_once"]
