"""Versions of what the bus writes and reads back later.

Three documents outlive the process that wrote them: the **envelope** (on queues, in outbox
records, on deferred tokens, in poison entries), the **outbox record** (in each partition's
outbox slot and in the send ledger) and the **poison entry** (on poison queues). Each carries
its version (``bus`` in an envelope, ``v`` in the others; a document without it is version 1,
as everything written before versions were checked).

The rule that makes upgrades safe while old and new code run side by side (a rolling
deployment, a Spark job on an older package, messages still queued from last month): a
reader reads the current version **and the one before it**. A release that introduces
version N+1 reads N+1 (upgrading N documents as it reads them) but still writes N; the
release after it writes N+1, when every reader still running reads it. A document of a
version the reader does not read is never guessed at: it raises ``UnreadableVersion`` with a
reason, and the caller poisons the signal (replayable once the reader is upgraded) or skips
the stored record and says so.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bus.errors import UnreadableVersion

Document = dict[str, Any]


@dataclass(frozen=True)
class Format:
    """One kind of document: the key holding its version, the version written, and how to
    bring each older version it still reads up to the next (``upgrades[n]``: n -> n+1)."""

    name: str
    key: str
    current: int
    upgrades: Mapping[int, Callable[[Document], Document]] = field(default_factory=dict)

    @property
    def oldest(self) -> int:
        """The oldest version read (upgraded on reading)."""
        return min((self.current, *self.upgrades))

    def read(self, document: Document) -> Document:
        """``document`` as the current version, or UnreadableVersion."""
        version = document.get(self.key, 1)
        if not isinstance(version, int) or isinstance(version, bool):
            raise UnreadableVersion(f"{self.name} version {version!r} is not a number")
        if version > self.current:
            raise UnreadableVersion(
                f"{self.name} version {version} is newer than this bus reads "
                f"({self._readable()}): upgrade the bus package where it is read")
        if version < self.oldest:
            raise UnreadableVersion(
                f"{self.name} version {version} is older than this bus reads "
                f"({self._readable()})")
        while version < self.current:
            document = self.upgrades[version](document)
            version += 1
        return {**document, self.key: self.current}

    def _readable(self) -> str:
        versions = range(self.oldest, self.current + 1)
        return ", ".join(str(v) for v in versions)


ENVELOPE = Format("envelope", "bus", 2, {1: lambda document: document})
"""Version 2 adds ``encryption`` (an encrypted payload, which a version-1 reader would take
for the message itself); the bus writes version 2 only for envelopes with an encrypted
payload, version 1 for every other (``Envelope.bus``)."""
OUTBOX_RECORD = Format("outbox record", "v", 1)
POISON_ENTRY = Format("poison entry", "v", 2, {1: lambda document: document})
"""Version 2 adds ``entry_ref`` (an entry kept in a blob: ``bus.protocol.poison.queue``); the bus
writes version 1 for every entry that fits a queue message."""
