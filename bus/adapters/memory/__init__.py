"""The in-memory storage backend: a shipped feature for unit tests and simulation.

It behaves like Azure Storage where the protocol can tell (ETags, 409/412/404, leases, dequeue
counts, atomic entity-group transactions) and can inject faults deterministically through
:class:`~bus.adapters.memory.faults.FaultHooks`.
"""

from bus.adapters.memory.faults import Fault, FaultHooks, NoFaults
from bus.adapters.memory.store import InMemoryStorage

__all__ = ["Fault", "FaultHooks", "InMemoryStorage", "NoFaults"]
