"""The circuit breaker: pause an endpoint's consumption, and resume it cheaply.

Two ways to open it:

* explicitly, for every worker of the endpoint: ``Bus.pause(endpoint, seconds, reason)`` writes
  a control row in the endpoint's state table (``Bus.resume`` deletes it); workers read it at
  most every ``check_every`` seconds, so a pause costs one read per worker per interval;
* automatically, in one worker, when storage throttles (HTTP 503 / server busy): for the
  ``Retry-After`` the service gave, or ``backoff`` seconds.

While it is open the worker leases nothing; messages wait in the queue (their leases are not
touched), so nothing is lost and nothing is processed twice. Service Bus has no such switch;
its processors stop receiving when you stop them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from bus.bus import Bus
from bus.storage import StorageError, Throttled

log = logging.getLogger(__name__)


class CircuitBreaker:
    def __init__(self, bus: Bus, endpoint: str, *, check_every: float = 5.0,
                 backoff: float = 5.0, clock: Callable[[], float] = time.time) -> None:
        self._bus = bus
        self._endpoint = endpoint
        self._check_every = check_every
        self._backoff = backoff
        self._clock = clock
        self._tripped_until = 0.0
        self._shared_until = 0.0
        self._checked_at = float("-inf")

    def paused_for(self) -> float:
        """Seconds until consumption may resume (0: closed, go ahead)."""
        now = self._clock()
        if now - self._checked_at >= self._check_every:
            self._checked_at = now
            try:
                pause = self._bus.paused(self._endpoint)
            except StorageError as exc:  # cannot tell: keep what we knew
                log.info("could not read the pause of %s: %s", self._endpoint, exc)
            else:
                self._shared_until = pause.until if pause else 0.0
        return max(0.0, self._tripped_until - now, self._shared_until - now)

    def throttled(self, exc: Throttled) -> None:
        """Storage said it is busy: stop consuming for its Retry-After (or ``backoff``)."""
        seconds = exc.retry_after if exc.retry_after is not None else self._backoff
        self._tripped_until = max(self._tripped_until, self._clock() + seconds)
        log.warning("storage is throttling %s: pausing consumption for %.1f s", self._endpoint,
                    seconds)
