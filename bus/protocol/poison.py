"""The poison queue: where a signal goes when the endpoint cannot or will not process it.

Each entry is a JSON document (base64-encoded, like every signal) with the reason, the exception
text, the delivery count, the endpoint and the original body exactly as it was on the queue, so
nothing is lost and a person can see why.
"""

from __future__ import annotations

import base64
import json
from datetime import datetime, timezone
from typing import Literal

from pydantic import BaseModel, ConfigDict

from bus.envelope import Envelope
from bus.storage import Queues
from bus.versions import POISON_ENTRY


class PoisonEntry(BaseModel):
    model_config = ConfigDict(frozen=True)

    v: Literal[1] = 1
    """The entry's version (``bus.versions.POISON_ENTRY``)."""
    reason: str
    exception: str | None = None
    dequeue_count: int
    endpoint: str
    poisoned_at: datetime
    original_body: str
    envelope: Envelope | None = None

    def encode(self) -> str:
        return base64.b64encode(self.model_dump_json(exclude_none=True).encode()).decode()

    @classmethod
    def decode(cls, body: str) -> PoisonEntry:
        document = json.loads(base64.b64decode(body))
        if not isinstance(document, dict):
            raise ValueError("a poison entry is a JSON object")
        return cls.model_validate(POISON_ENTRY.read(document))


class PoisonQueue:
    def __init__(self, queues: Queues, queue: str, endpoint: str) -> None:
        self._queues = queues
        self._queue = queue
        self._endpoint = endpoint

    def put(self, original_body: str, *, reason: str, dequeue_count: int, now: float,
            envelope: Envelope | None = None, exception: str | None = None) -> None:
        entry = PoisonEntry(
            reason=reason, exception=exception, dequeue_count=dequeue_count,
            endpoint=self._endpoint, original_body=original_body, envelope=envelope,
            poisoned_at=datetime.fromtimestamp(now, tz=timezone.utc))
        self._queues.send(self._queue, entry.encode())
