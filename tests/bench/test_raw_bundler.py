"""The bundling raw loop's group commit, on Azurite: every number sent once, in shared
messages, each caller back only once its number went."""

from __future__ import annotations

import json
import threading

import pytest
from azure.storage.queue import QueueServiceClient

from bench.scenarios.raw import Bundler
from bus.protocol.copies.bundles import MAX_PARTS
from devhost.azurite import azurite

pytestmark = pytest.mark.azurite


def test_concurrent_senders_share_messages_and_lose_nothing() -> None:
    with azurite() as connection:
        queue = QueueServiceClient.from_connection_string(connection).get_queue_client("bundled")
        queue.create_queue()
        bundler = Bundler(queue)
        returned: list[int] = []

        def sender(first: int) -> None:
            for seq in range(first, 400, 8):
                bundler.send(seq)
                returned.append(seq)

        threads = [threading.Thread(target=sender, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        found: list[int] = []
        messages = 0
        while batch := list(queue.receive_messages(max_messages=32)):
            for message in batch:
                numbers = json.loads(message.content)
                assert 1 <= len(numbers) <= MAX_PARTS
                found += numbers
                messages += 1
                queue.delete_message(message)
    assert sorted(found) == list(range(400)) == sorted(returned)
    assert messages == bundler.sends < 400  # eight senders waiting share a message
