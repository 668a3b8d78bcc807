"""Back-off: how long the bus waits before trying again, in one place (tenacity).

Two kinds of trying again share these numbers - a first wait of ``FIRST_WAIT`` seconds,
doubling up to ``LONGEST_WAIT``:

* a storage call that met a transient error (``transient_retries``): the hosts, the client's
  sends, the Spark jobs;
* a handler's immediate retries within one delivery (``bus.retry.RetryPolicy``'s defaults).

Where a run must replay from its seed (the simulation), the jitter is drawn from the bus's own
``random`` (``backoff``); elsewhere tenacity's (``exponential_jitter``).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
    wait_exponential_jitter,
)
from tenacity.wait import wait_base

from bus.errors import TransientError

FIRST_WAIT = 0.05
"""Seconds before the first retry."""
LONGEST_WAIT = 2.0
"""The longest wait between two tries."""

Wait = wait_base | Callable[[RetryCallState], float]

_MULTIPLIER = "multiplier" in inspect.signature(wait_exponential_jitter).parameters


def backoff(initial: float, longest: float,
            random: Callable[[], float]) -> Callable[[RetryCallState], float]:
    """A tenacity wait: ``initial`` doubling per attempt up to ``longest``, plus a jitter of up
    to ``initial`` drawn from ``random`` (the bus's, so a simulation replays from its seed)."""
    def wait(state: RetryCallState) -> float:
        exponential = initial * 2.0 ** (state.attempt_number - 1)
        return float(min(longest, exponential) + random() * initial)

    return wait


def exponential_jitter(first: float = FIRST_WAIT, longest: float = LONGEST_WAIT) -> wait_base:
    """tenacity's ``wait_exponential_jitter`` from ``first`` seconds, doubling up to
    ``longest``. tenacity 9.2 renamed its ``initial`` to ``multiplier`` and warns on the old
    name; the releases before it (8.2 to 9.1, preinstalled on Databricks and Fabric) know only
    ``initial``."""
    if _MULTIPLIER:
        return wait_exponential_jitter(multiplier=first, max=longest)
    return wait_exponential_jitter(first, longest)  # positional: ``initial``


def exponential(first: float = FIRST_WAIT, longest: float = LONGEST_WAIT) -> wait_base:
    """``first`` seconds doubling up to ``longest``, without jitter."""
    return wait_exponential(multiplier=first, max=longest)


def transient_retries(tries: int, wait: Wait | None = None,
                      sleep: Callable[[float], None] = time.sleep) -> Retrying:
    """Up to ``tries`` attempts on TransientError, exponential back-off with jitter
    (``exponential_jitter`` unless ``wait`` is given); the last error is re-raised."""
    return Retrying(stop=stop_after_attempt(tries),
                    wait=wait or exponential_jitter(),
                    retry=retry_if_exception_type(TransientError), sleep=sleep, reraise=True)
