"""Storage operations counted (``bus.storage.counting``), where the benchmarks and tests have
always imported them from."""

from bus.storage.counting import ErrorKey, OpCounter, OpKey, counting_storage

__all__ = ["ErrorKey", "OpCounter", "OpKey", "counting_storage"]
