"""Testing helpers shipped with the package.

* :class:`InMemoryStorage` - queues, blobs and tables in memory, for users' unit tests;
* ``bus.testing.contract`` - the storage contract suite every backend passes;
* ``python -m bus.testing.simulate`` - the deterministic fault-injecting simulation;
* :class:`DuplicatingQueues` - duplicate signals on any backend (demos, end-to-end tests);
* :func:`counting_storage` - storage requests counted by service and operation (benchmarks);
* :func:`drain` - run every endpoint until idle, failing on a poisoned message (tests);
* :func:`seamed_bus` - a Bus with another clock, ids, sleeps or safeguards (:class:`Seams`).
"""

from bus.adapters.memory import Fault, FaultHooks, InMemoryStorage, NoFaults
from bus.seams import Seams
from bus.testing.counting import OpCounter, counting_storage
from bus.testing.drain import Drained, MessagesPoisoned, drain
from bus.testing.seamed import seamed_bus
from bus.testing.transport import DuplicatingQueues, with_duplicates

__all__ = ["Drained", "DuplicatingQueues", "Fault", "FaultHooks", "InMemoryStorage",
           "MessagesPoisoned", "NoFaults", "OpCounter", "Seams", "counting_storage", "drain",
           "seamed_bus", "with_duplicates"]
