"""Identifiers: random attempt ids, deterministic message ids.

A message sent from a handler gets an id derived from the incoming message id and the send's
position in the handler (the "continuation marker" idea of the SafeBunny library), so re-running the
handler after a crash produces the same ids.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

IdFactory = Callable[[], str]

# Fixed namespace for uuid5: changing it changes every derived id.
BUS_NAMESPACE = uuid.UUID("6f0c6f9e-5d1e-4a53-9d1b-2b0b8c3e7a41")


def random_id() -> str:
    return uuid.uuid4().hex


def derived_message_id(incoming_message_id: str, position: int) -> str:
    """The id of the ``position``-th message a handler sends while handling a message."""
    return uuid.uuid5(BUS_NAMESPACE, f"{incoming_message_id}/{position}").hex
