"""In-process retries of transient storage errors, shared by the hosts (tenacity)."""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential_jitter,
)
from tenacity.wait import wait_base

from bus.storage import TransientError

Wait = wait_base | Callable[[RetryCallState], float]

_MULTIPLIER = "multiplier" in inspect.signature(wait_exponential_jitter).parameters


def exponential_jitter(first: float = 0.05, longest: float = 2.0) -> wait_base:
    """tenacity's ``wait_exponential_jitter`` from ``first`` seconds, doubling up to
    ``longest``. tenacity 9.2 renamed its ``initial`` to ``multiplier`` and warns on the old
    name; the releases before it (8.2 to 9.1, preinstalled on Databricks and Fabric) know only
    ``initial``."""
    if _MULTIPLIER:
        return wait_exponential_jitter(multiplier=first, max=longest)
    return wait_exponential_jitter(first, longest)  # positional: ``initial``


def transient_retries(tries: int, wait: Wait | None = None,
                      sleep: Callable[[float], None] = time.sleep) -> Retrying:
    """Up to ``tries`` attempts on TransientError, exponential backoff with jitter; the last
    error is re-raised."""
    return Retrying(stop=stop_after_attempt(tries),
                    wait=wait or exponential_jitter(),
                    retry=retry_if_exception_type(TransientError), sleep=sleep, reraise=True)
