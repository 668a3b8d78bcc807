"""What an inbox token's state means for a copy of its message that arrives now.

Every place that meets a copy decides with :func:`verdict`, and nowhere else: the receiver
(``receive``: the token check before the claim, a scheduled copy that arrived early, an
expired copy, a copy whose claim-check payload is missing, a copy being poisoned), the Spark
reader
(``bus.integrations.spark.reader``), the poison-queue tools (``poisoned``: replay and
purge) and the sweeper, for a claim-check blob (is its payload garbage?). The sweeper's other
question - which tokens are old enough to collect - is about ages, not copies, and reads the
states itself.

=============  ===============================  ==========================================
verdict        token                            the copy
=============  ===============================  ==========================================
``PROCESS``    live, or pending                 may be processed: its effect has not
                                                happened (a pending token's signal exists
                                                only once its record is committed)
``CONSUMED``   none                             a duplicate: processed (or purged); its
                                                claim-check payload is garbage
``FENCED``     fenced                           a duplicate: its sending attempt was
                                                superseded and never takes effect; payload
                                                garbage
``POISONED``   poisoned                         dropped: the message waits in the poison
                                                queue for a replay - except a token the
                                                sweeper poisoned as a presumed orphan: its
                                                signal came after all, so ``PROCESS``
``DEFERRED``   deferred                         dropped: its handler set it aside, and the
                                                deferral keeps the signal and its payload
=============  ===============================  ==========================================
"""

from __future__ import annotations

import enum

from bus.protocol.tokens.inbox import Token, TokenState


class Verdict(str, enum.Enum):
    PROCESS = "process"
    CONSUMED = "consumed"
    FENCED = "fenced"
    POISONED = "poisoned"
    DEFERRED = "deferred"

    @property
    def duplicate(self) -> bool:
        """The copy is a duplicate of a message that took (or will never take) effect."""
        return self in (Verdict.CONSUMED, Verdict.FENCED, Verdict.DEFERRED)

    @property
    def payload_is_garbage(self) -> bool:
        """Nothing will read the copy's claim-check payload again (tokens are created before
        their payload blob, and the blob is read only before a commit)."""
        return self in (Verdict.CONSUMED, Verdict.FENCED)


_BY_STATE = {TokenState.LIVE: Verdict.PROCESS, TokenState.PENDING: Verdict.PROCESS,
             TokenState.FENCED: Verdict.FENCED, TokenState.POISONED: Verdict.POISONED,
             TokenState.DEFERRED: Verdict.DEFERRED}


def verdict(token: Token | None) -> Verdict:
    """The verdict on a copy whose token (read now) is ``token``."""
    if token is None:
        return Verdict.CONSUMED
    if token.processable:
        return Verdict.PROCESS  # a poisoned orphan too: its signal disproves the presumption
    return _BY_STATE[token.state]
