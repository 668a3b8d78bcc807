"""Testing helpers shipped with the package.

* :class:`InMemoryStorage` - queues, blobs and tables in memory, for users' unit tests;
* ``bus.testing.contract`` - the storage contract suite every backend passes;
* ``python -m bus.testing.simulate`` - the deterministic fault-injecting simulation.
"""

from bus.adapters.memory import Fault, FaultHooks, InMemoryStorage, NoFaults

__all__ = ["Fault", "FaultHooks", "InMemoryStorage", "NoFaults"]
