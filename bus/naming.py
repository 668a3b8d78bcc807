"""Storage resource names, derived from endpoint names by one documented rule.

A program that does not use ``bus`` can compute the same names (see docs/envelope.md):

* queue of endpoint ``e``: ``e`` lower-cased, every run of characters other than ``a-z0-9``
  replaced by one ``-``, trimmed of ``-``; with a prefix ``p``: ``p-e``. Longer than 56
  characters: cut to 47 and followed by ``-`` and 8 hex digits of SHA-1 of the full name.
* poison queue: the queue name followed by ``-poison`` (the Azure Functions convention).
* state table of ``e``: ``<p>state<e with only a-z0-9 kept>``; inbox tokens: ``<p>bustokens``;
  the send ledger (``Bus.send_once``): ``<p>busledger``; the audit trail: ``<p>busaudit``;
  heartbeats: ``<p>businstances``.
* containers: ``<p>-bus-payloads`` (claim checks) and ``<p>-bus-topics`` (recipient lists).
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass

from bus.errors import NamingError

RESERVED_PREFIX = "~"
"""Keys starting with it in an endpoint's state table are the bus's own (its outbox slot,
session rows, statistics): a handler's state keys may not."""
RESERVED_PARTITION_PREFIX = "~bus."
"""Partitions of an endpoint's state table starting with it are the bus's own (statistics,
removed a day at a time): a message whose partition key starts with it is poisoned."""
ENDPOINT_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
PREFIX_PATTERN = re.compile(r"^([a-z][a-z0-9]{0,15})?$")
MAX_QUEUE = 63 - len("-poison")


def check_endpoint(name: str) -> str:
    if not ENDPOINT_PATTERN.match(name):
        raise NamingError(
            f"endpoint name {name!r} is invalid: use 1-63 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit")
    return name


def _shorten(name: str, limit: int, joiner: str) -> str:
    if len(name) <= limit:
        return name
    digest = hashlib.sha1(name.encode()).hexdigest()[:8]
    return name[: limit - 9] + joiner + digest


def _dns(name: str, limit: int = 63) -> str:
    cleaned = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    cleaned = cleaned.ljust(3, "0")
    return _shorten(cleaned, limit, "-")


def _alnum(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


# Names are asked for on every storage call (the simulation's hosts ask for thousands a
# second): each is a pure function of the prefix and the endpoint, so it is computed once.
@functools.lru_cache(maxsize=4096)
def _queue(prefix: str, endpoint: str) -> str:
    check_endpoint(endpoint)
    return _dns(f"{prefix}-{endpoint}" if prefix else endpoint, MAX_QUEUE)


@functools.lru_cache(maxsize=4096)
def _state_table(prefix: str, endpoint: str) -> str:
    check_endpoint(endpoint)
    return _shorten(f"{prefix}state{_alnum(endpoint)}", 63, "x")


@dataclass(frozen=True)
class Names:
    """Every resource name of one bus installation. ``prefix`` isolates installations
    (and tests) that share a storage account."""

    prefix: str = ""

    def __post_init__(self) -> None:
        if not PREFIX_PATTERN.match(self.prefix):
            raise NamingError(
                f"prefix {self.prefix!r} is invalid: up to 16 lower-case letters and digits, "
                "starting with a letter")

    def queue(self, endpoint: str) -> str:
        return _queue(self.prefix, endpoint)

    def poison_queue(self, endpoint: str) -> str:
        return self.queue(endpoint) + "-poison"

    def state_table(self, endpoint: str) -> str:
        return _state_table(self.prefix, endpoint)

    @property
    def ledger_table(self) -> str:
        """Idempotent client sends (``Bus.send_once``): one row per message id."""
        return f"{self.prefix}busledger"

    @property
    def tokens_table(self) -> str:
        return f"{self.prefix}bustokens"

    @property
    def audit_table(self) -> str:
        """The operators' audit trail (``bus.audit``): one row per action, by day."""
        return f"{self.prefix}busaudit"

    @property
    def instances_table(self) -> str:
        """The processes serving endpoints, their heartbeats (``bus.observability.heartbeat``);
        the alerts' states (``bus.hosting.alerts``)."""
        return f"{self.prefix}businstances"

    @property
    def payload_container(self) -> str:
        return _dns(f"{self.prefix}-bus-payloads")

    @property
    def topic_container(self) -> str:
        return _dns(f"{self.prefix}-bus-topics")
