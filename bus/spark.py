"""``bus.spark``: the Spark integration under its short name (see bus.integrations.spark)."""

from __future__ import annotations

from bus.integrations.spark import (
    OptionError,
    PublishResult,
    RowError,
    commit_read,
    forget_read,
    publish,
    receive,
    register,
    subscribe,
    sweep_staging,
    write_results,
)

__all__ = ["OptionError", "PublishResult", "RowError", "commit_read", "forget_read", "publish",
           "receive", "register", "subscribe", "sweep_staging", "write_results"]
