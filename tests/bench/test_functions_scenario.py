"""The Functions-path scenario on Azurite: the hop through the local host and the real worker,
its requests counted at the delay proxy."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bench.config import QUICK
from bench.scenarios.functions_hop import one_run

pytestmark = pytest.mark.azurite


def test_a_tiny_grouped_run_counts_the_host_and_worker_requests() -> None:
    run = one_run(replace(QUICK, messages=12, producers=2, timeout=120), "grouped")
    assert run.messages == 12 and run.seconds > 0
    # Every hop leaves at least its commit (a transaction) and its Pong: counted from the
    # other processes, at the proxy; this process's own requests are left out.
    assert run.ops[("table", "transact")] >= 12 / 4
    assert run.ops[("queue", "send")] >= 1
    assert run.ops.get(("queue", "receive"), 0) >= 1
    assert run.requests_per_hop > 1
