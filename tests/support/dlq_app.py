"""A small app for the poison-queue tests: a handler that fails while ``FAILING`` is set.

The CLI test imports it the way ``python -m bus dlq --app tests.support.dlq_app`` does; it reads the
storage connection and prefix from the environment, as a Functions app does.
"""

from __future__ import annotations

import os
from typing import Any

from bus import Bus, Command, Context, Endpoint, RetryPolicy, Settings
from bus.storage import Storage

FAILING = {"on": True}


class Charge(Command):
    order_id: str
    amount: int
    note: str = ""  # long enough, it travels as a claim-check blob


def build(storage: Storage, prefix: str, **settings: Any) -> Bus:
    payments = Endpoint("payments", retry=RetryPolicy(delays=(0.0,)))  # redeliver at once

    @payments.handles(Charge, partition=lambda m: m.order_id)
    def charge(message: Charge, ctx: Context) -> None:
        if FAILING["on"]:
            raise RuntimeError(f"gateway down for {message.order_id}")
        row = ctx.state.get("charge") or {"times": 0}
        times = row["times"]
        assert isinstance(times, int)
        ctx.state.put("charge", {"times": times + 1, "amount": message.amount})

    bus = Bus(storage, [payments], prefix=prefix,
              settings=Settings(max_delivery_count=2, **settings))
    bus.provision()
    return bus


def _from_environment() -> Bus | None:
    connection = os.environ.get("DLQ_APP_STORAGE")
    if not connection:
        return None
    from bus.adapters.azure import AzureStorage

    return build(AzureStorage.from_connection_string(connection), os.environ["DLQ_APP_PREFIX"])


bus = _from_environment()
