"""In-process retries of transient storage errors, shared by the hosts (tenacity)."""

from __future__ import annotations

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


def transient_retries(tries: int, wait: Wait | None = None,
                      sleep: Callable[[float], None] = time.sleep) -> Retrying:
    """Up to ``tries`` attempts on TransientError, exponential backoff with jitter; the last
    error is re-raised."""
    return Retrying(stop=stop_after_attempt(tries),
                    wait=wait or wait_exponential_jitter(multiplier=0.05, max=2.0),
                    retry=retry_if_exception_type(TransientError), sleep=sleep, reraise=True)
