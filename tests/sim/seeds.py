"""The simulation's seeds: a fixed slice for the developer's loop, and a slice that follows the
commit for ``make test``, so that CI runs over many commits cover the seed space instead of the
same seeds forever.

``--sim-slice N`` (default 150; declared in tests/conftest.py) is the size of the commit's
slice, ``--sim-base SEED`` its first seed (default: derived from ``git rev-parse HEAD``; with no
git, 1). The seeds used are printed in the report header; one run replays with
``python -m bus.testing.simulate --runs 1 --seed S``.
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SEED_SPACE = 10**9
CHUNK = 10
"""Seeds per test of the commit's slice: xdist spreads the chunks over its workers. About 30 s
each on this machine (a seed takes 2-3 s), far inside the 300 s a test may take even on a
machine three times busier (25 a chunk ran past it when CI shared the cores with other work)."""


@functools.cache
def _commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                             text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def slice_of(config: pytest.Config) -> tuple[range, str]:
    """The commit's slice of seeds and where its first seed came from."""
    size = max(0, int(config.getoption("--sim-slice")))
    base = config.getoption("--sim-base")
    if base is not None:
        origin = "--sim-base"
    elif (commit := _commit()) is not None:
        base, origin = int(commit[:12], 16) % SEED_SPACE, f"commit {commit[:12]}"
    else:
        # Every xdist worker must draw the same seeds: nothing random, nothing from the clock.
        base, origin = 1, "seed 1: no git commit here"
    return range(base, base + size), origin


def header(config: pytest.Config) -> str:
    """The report header's line: which seeds the slice runs, and how to replay one."""
    seeds, origin = slice_of(config)
    if not seeds:
        return "simulation slice: off (--sim-slice 0)"
    return (f"simulation slice: {len(seeds)} runs, seeds {seeds.start}..{seeds.stop - 1} "
            f"(from {origin}); replay one: python -m bus.testing.simulate --runs 1 --seed S")
