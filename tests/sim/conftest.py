"""The commit's seeds, handed to the test that runs them in chunks (tests/sim/seeds.py)."""

from __future__ import annotations

import pytest

from tests.sim.seeds import CHUNK, slice_of


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "commit_seeds" in metafunc.fixturenames:
        seeds, _ = slice_of(metafunc.config)
        chunks = [seeds[i:i + CHUNK] for i in range(0, len(seeds), CHUNK)]
        metafunc.parametrize("commit_seeds", chunks,
                             ids=[f"{chunk.start}-{chunk.stop - 1}" for chunk in chunks])
