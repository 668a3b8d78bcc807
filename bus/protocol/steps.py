"""The steps of a delivery, named once: R1-R8 receive a signal, D1-D6 complete a committed
record. docs/protocol.md explains each (what it guards against, the break that shows it is
needed), docs/architecture.md places them in the modules, the code refers to them by these
codes, and ``Bus.pipeline`` lists them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Step:
    code: str
    """``R1``..``R8`` (receiving), ``D1``..``D6`` (completing a record)."""
    name: str
    """A word for it, as ``Bus.pipeline`` shows it."""
    module: str
    """The module under ``bus.protocol`` that does it (``receive.admission``)."""
    summary: str


RECEIVE = (
    Step("R1", "admit", "receive.admission",
         "decode the envelope, verify its signature, route it; poison what cannot be handled; "
         "put back a copy not yet due"),
    Step("R2", "payload", "receive.admission",
         "fetch the payload (claim check), open it, decode the message, map it to its state "
         "partition"),
    Step("R3", "claim", "receive.receiver",
         "load the partition's outbox slot with its ETag and the declared rows; complete an "
         "unfinished record first"),
    Step("R4", "deduplicate", "receive.receiver",
         "check the copy's inbox token: gone or fenced - a duplicate; poisoned - in the "
         "poison queue already; live but past its time-to-live - poison it as expired"),
    Step("R5", "handle", "receive.handling",
         "run the handler (immediate retries, middleware) against the partition; create the "
         "outgoing tokens, pending"),
    Step("R6", "commit", "receive.receiver",
         "commit the state and the outbox record in one transaction, If-Match on R3's ETag; "
         "lost - back to R3"),
    Step("R7", "complete", "outbox.dispatch",
         "complete the record (D1-D6), then acknowledge the signal"),
    Step("R8", "fail", "poison.poisoning",
         "a handler that raises: redelivered until the last delivery allowed, then poisoned "
         "with the exception"),
)
"""Receiving one signal (``bus.protocol.receive.receiver``)."""

COMPLETE = (
    Step("D1", "fresh attempts", "outbox.dispatch",
         "helpers only: fresh attempt ids for the outgoing copies, persisted by "
         "compare-and-swap"),
    Step("D2", "tokens", "outbox.dispatch",
         "create each outgoing copy's token, then its claim-check blob (usually before the "
         "commit, pending)"),
    Step("D3", "sending", "outbox.dispatch",
         "persist phase SENDING: tokens are never created again"),
    Step("D4", "signals", "outbox.dispatch",
         "send the signals (bundled per queue)"),
    Step("D5", "fence and confirm", "outbox.dispatch",
         "fence superseded attempt ids; confirm pending tokens"),
    Step("D6", "finish", "outbox.dispatch",
         "release the deferrals asked for, then consume (or set aside) the incoming token and "
         "its payload"),
)
"""Completing a committed outbox record (``bus.protocol.outbox.dispatch``)."""


def pipeline(middleware: tuple[str, ...]) -> list[str]:
    """One successful delivery's stages, outermost first: ``R1 admit`` to ``R7 complete``,
    with the middleware's names (``[name]``) around the handler in R5."""
    stages: list[str] = []
    for step in RECEIVE:
        if step.code == "R8":
            continue  # a failing handler's path, not a stage of a delivery that succeeds
        if step.code == "R5":
            stages += ["R5 retries", *(f"[{name}]" for name in middleware), "R5 handler"]
        elif step.code == "R7":
            stages += ["R7 complete", "R7 acknowledge"]
        else:
            stages.append(f"{step.code} {step.name}")
    return stages
