"""Fixtures every tier shares, and the tiers' markers, derived from what each test uses.

A test's tier is not a list kept by hand: a test that takes Azurite (the ``azurite_connection``
fixture, directly or through another fixture) is marked ``azurite``; one that takes the
``spark`` session is marked ``spark``; one that takes the ``browser`` is marked ``browser``; a
module that imports Microsoft's Functions worker (the local host, ``bus.hosting.local``, or
``azure_functions_runtime``, anywhere in it) is marked ``worker``; so is a test marked so by
hand (one that runs ``python -m bus host`` in a process). ``make check`` runs what is
left (docs/testing.md). The Azure SDK is imported by the fixtures that build on Azurite, not
here: a run of the in-memory tiers does not pay for it.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import json
import logging
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from bus.storage import Storage
from bus.testing import InMemoryStorage

if TYPE_CHECKING:
    from bus.adapters.azure import AzureStorage

FIXTURE_TIERS = {"azurite_connection": "azurite", "spark": "spark", "browser": "browser"}
"""A fixture in a test's closure -> the tier marker the test gets."""
WORKER_MODULES = ("bus.hosting.local", "azure_functions_runtime")
"""Importing any of these (anywhere in a test module) runs Microsoft's Functions worker."""
SLOW_SECONDS = 5.0
"""A test that took this long last time is started first, longest first: on two cores the
slowest simulation test (over a minute) otherwise starts last and the run waits for it."""
KNOWN_SLOW = ("sim_long", "sim_slice")
"""Markers of tests that take tens of seconds to minutes each (the simulation's long breaks, then
the commit's slice): without a record of durations they are started first, in this order, or
the run waits for the ones that happened to start last."""
DURATIONS = Path(__file__).resolve().parents[1] / ".test-durations.json"
"""Each test's duration in the last run that ran it (ignored by git; ``make clean`` removes it).
Not pytest's cache, which pyproject.toml turns off."""


def pytest_addoption(parser: pytest.Parser) -> None:
    # The simulation's slice that follows the commit (tests/sim/conftest.py); declared here, in
    # the root conftest, so that pytest knows the options before it collects tests/sim.
    group = parser.getgroup("simulation")
    group.addoption("--sim-slice", type=int, default=150,
                    help="runs in the simulation slice that follows the commit (default 150)")
    group.addoption("--sim-base", type=int, default=None,
                    help="first seed of that slice (default: from git rev-parse HEAD)")


def pytest_report_header(config: pytest.Config) -> str:
    from tests.sim.seeds import header

    return header(config)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    _slowest_first(items)
    for item in items:
        closure = getattr(item, "fixturenames", ())
        for fixture, tier in FIXTURE_TIERS.items():
            if fixture in closure:
                item.add_marker(tier)
        path = Path(str(item.fspath))
        if path.suffix == ".py" and _imports_the_worker(path):
            item.add_marker("worker")


def _slowest_first(items: list[pytest.Item]) -> None:
    """Move the tests that were slow last time (``DURATIONS``) to the front, longest first; the
    others keep their order. Every xdist worker reads the same file, so all collect the same
    order; a fresh clone has none and starts the tests marked ``KNOWN_SLOW`` first."""
    last = _last_durations()
    if not last:  # a fresh clone (CI): the tests known to take tens of seconds each first
        items.sort(key=lambda item: next((rank for rank, marker in enumerate(KNOWN_SLOW)
                                          if item.get_closest_marker(marker)), len(KNOWN_SLOW)))
        return
    slow = sorted((item for item in items if last.get(item.nodeid, 0.0) >= SLOW_SECONDS),
                  key=lambda item: -last[item.nodeid])
    if slow:
        rest = [item for item in items if last.get(item.nodeid, 0.0) < SLOW_SECONDS]
        items[:] = [*slow, *rest]


def _last_durations() -> dict[str, float]:
    try:
        found = json.loads(DURATIONS.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {k: float(v) for k, v in found.items()} if isinstance(found, dict) else {}


_durations: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call":
        _durations[report.nodeid] = report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Remember this run's durations: the controller's, which sees every worker's reports."""
    if hasattr(session.config, "workerinput") or not _durations:
        return
    merged = {**_last_durations(), **_durations}
    with contextlib.suppress(OSError):  # a read-only checkout runs in the usual order
        DURATIONS.write_text(json.dumps(merged, sort_keys=True), encoding="utf-8")


@functools.cache
def _imports_the_worker(path: Path) -> bool:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        if any(name == module or name.startswith(module + ".")
               for name in names for module in WORKER_MODULES):
            return True
    return False


@pytest.fixture(scope="session")
def azurite_connection() -> Iterator[str]:
    """A real Azurite for this test process (each xdist worker starts its own, on free
    loopback ports), stopped at the end of the session."""
    if os.environ.get("BUS_TEST_TIER") == "check":
        pytest.fail("a test reached Azurite in `make check` without being marked `azurite`: "
                    "take the `azurite_connection` fixture (or mark it) rather than asking "
                    "for it at run time", pytrace=False)
    from devhost.azurite import azurite

    with azurite() as connection:
        yield connection


@pytest.fixture
def azure_storage(azurite_connection: str) -> AzureStorage:
    from bus.adapters.azure import AzureStorage

    return AzureStorage.from_connection_string(azurite_connection)


@pytest.fixture(params=["memory", pytest.param("azurite", marks=pytest.mark.azurite)])
def storage(request: pytest.FixtureRequest) -> Storage:
    """Each test that takes ``storage`` runs twice: on the in-memory backend and on Azurite
    (marked ``azurite`` by its parameter: Azurite is asked for at run time)."""
    if request.param == "memory":
        return InMemoryStorage()
    from bus.adapters.azure import AzureStorage

    return AzureStorage.from_connection_string(request.getfixturevalue("azurite_connection"))


@pytest.fixture
def prefix() -> str:
    """A fresh prefix per test: its own queues, tables and containers."""
    return "t" + uuid.uuid4().hex[:10]


@pytest.fixture(autouse=True)
def _quiet_azure_logs() -> None:
    logging.getLogger("azure").setLevel(logging.WARNING)
