"""Poison entries as the run's checks read them: whole, outside the faults.

An entry too large for a queue message (a payload near the limit, with its reason) is kept in
a blob and the queue holds a pointer to it (``PoisonQueue.put``); the checks read the whole
entry, as the operator's tools do, without going through the faulty storage calls.
"""

from __future__ import annotations

from bus.adapters.memory import InMemoryStorage
from bus.protocol.poison.queue import PoisonEntry


def whole_entry(storage: InMemoryStorage, body: str) -> PoisonEntry:
    """The whole entry ``body`` holds or points to (the pointer itself when its blob is
    gone); raises what ``PoisonEntry.decode`` raises."""
    entry = PoisonEntry.decode(body)
    ref = entry.entry_ref
    if ref is None:
        return entry
    data = storage.blobs.stored(ref.container, ref.blob)
    if data is None:
        return entry
    return PoisonEntry.decode(data.decode("ascii")).model_copy(update={"entry_ref": ref})
