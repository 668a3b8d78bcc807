"""Topics as recipient lists: one JSON blob per topic listing its subscriber endpoints.

``{"topic": "OrderPlaced", "subscribers": ["billing", "shipping"]}``

Subscribe and unsubscribe read the blob with its ETag and write it back only if unchanged
(create-only when absent), retrying on a lost race, so concurrent changes are never lost.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from bus.errors import TopicError
from bus.naming import ENDPOINT_PATTERN
from bus.storage import Blobs, Conflict, Missing, NotFound, PreconditionFailed, TransientError

_MAX_RACES = 50
_TOPIC = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")


class Topics:
    def __init__(self, blobs: Blobs, container: str) -> None:
        self._blobs = blobs
        self._container = container

    def subscribers(self, topic: str) -> list[str]:
        try:
            blob = self._blobs.read(self._container, _blob_name(topic))
        except Missing:
            raise  # no container: an event published now would silently reach no one
        except NotFound:
            return []
        return _parse(blob.data, topic)

    def subscribe(self, topic: str, endpoint: str) -> None:
        self._change(topic, lambda subs: [*subs, endpoint] if endpoint not in subs else subs)

    def unsubscribe(self, topic: str, endpoint: str) -> None:
        self._change(topic, lambda subs: [s for s in subs if s != endpoint])

    def _change(self, topic: str, edit: Callable[[list[str]], list[str]]) -> None:
        name = _blob_name(topic)
        for _ in range(_MAX_RACES):
            try:
                blob = self._blobs.read(self._container, name)
                current, etag = _parse(blob.data, topic), blob.etag
            except Missing:
                raise
            except NotFound:
                current, etag = [], None
            wanted = edit(current)
            if wanted == current and etag is not None:
                return
            data = json.dumps({"topic": topic, "subscribers": wanted}).encode()
            try:
                self._blobs.write(self._container, name, data, etag=etag,
                                  create_only=etag is None)
                return
            except Missing:
                raise
            except (Conflict, PreconditionFailed, NotFound, TransientError):
                continue  # lost a race (or the answer): read again and re-apply the edit
        raise TopicError(f"could not change topic {topic!r}: {_MAX_RACES} lost races in a row")


def _blob_name(topic: str) -> str:
    if not _TOPIC.match(topic):
        raise TopicError(f"topic name {topic!r} is invalid: letters, digits, '.', '_', '-'")
    return f"{topic}.json"


def _parse(data: bytes, topic: str) -> list[str]:
    try:
        document = json.loads(data)
        subscribers = document["subscribers"]
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise TopicError(f"topic file for {topic!r} is not a recipient list: "
                         f"{str(exc)[:200]}") from exc
    if not isinstance(subscribers, list) or not all(isinstance(s, str) for s in subscribers):
        raise TopicError(f"topic file for {topic!r}: 'subscribers' must be a list of names")
    bad = [s for s in subscribers if not ENDPOINT_PATTERN.match(s)]
    if bad:  # a name that is no endpoint would name queues and blobs nobody provisioned
        raise TopicError(f"topic file for {topic!r}: {bad[0][:80]!r} is not an endpoint name "
                         "(1-63 letters, digits, '.', '_' or '-')")
    return list(subscribers)
