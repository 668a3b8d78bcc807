"""The examples in docs/ run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bus.adapters.azure import AzureStorage
from bus.testing import drain
from tests.support.orderflow import build, state

pytestmark = pytest.mark.azurite
DOCS = Path(__file__).resolve().parents[2] / "docs"


def python_blocks(name: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (DOCS / name).read_text(), re.S)


def test_plain_sdk_sender_in_envelope_md_is_processed(azurite_connection: str,
                                                      prefix: str) -> None:
    bus = build(AzureStorage.from_connection_string(azurite_connection), prefix)
    [program] = python_blocks("envelope.md")
    exec(program, {"CONNECTION": azurite_connection, "PREFIX": prefix})
    assert drain(bus)["orders"] == {"processed": 1}
    assert state(bus, "orders", "plain-1", "order") == {"amount": 5, "note_size": 0}


def examples(name: str) -> dict[str, str]:
    """The blocks of ``name`` that start with ``# example: <title>``, by title."""
    return {block.splitlines()[0].removeprefix("# example:").strip(): block
            for block in python_blocks(name) if block.startswith("# example:")}


def test_settlement_md_has_its_examples() -> None:
    assert sorted(examples("settlement.md")) == ["back-pressure", "deferral", "middleware"]


@pytest.mark.parametrize(("doc", "title"), [
    ("settlement.md", "middleware"), ("settlement.md", "deferral"),
    ("settlement.md", "back-pressure"), ("operating.md", "maintenance"),
    ("operating.md", "routes"), ("operating.md", "read-state"), ("operating.md", "health"),
    ("sessions.md", "sessions"), ("observability.md", "tracing"),
    ("functions.md", "async-handler"), ("contracts.md", "rolling-deploy")])
def test_examples_run(azurite_connection: str, prefix: str, doc: str, title: str) -> None:
    program = examples(doc)[title]
    exec(program, {"CONNECTION": azurite_connection, "PREFIX": prefix,
                   "__name__": "docs_example"})


def test_contracts_md_has_its_examples() -> None:
    assert sorted(examples("contracts.md")) == ["rolling-deploy"]


def test_operating_md_has_its_examples() -> None:
    assert sorted(examples("operating.md")) == ["health", "maintenance", "read-state", "routes"]


def test_foreign_producer_in_signing_md_signs_with_plain_hmac(azurite_connection: str,
                                                               prefix: str) -> None:
    """Its copy verifies against a key bound to its source; with another secret under the
    same key id it is poisoned, never processed."""
    from bus.settings import Settings
    from bus.signing import Signing, SigningKey

    shop = SigningKey(key_id="shop", secret=b"s" * 32, sources=frozenset({"legacy-shop"}))
    signing = Signing(mode="required", key_id="app",
                      keys=(SigningKey(key_id="app", secret=b"a" * 32), shop))
    bus = build(AzureStorage.from_connection_string(azurite_connection), prefix,
                settings=Settings(signing=signing))
    program = examples("signing.md")["foreign-producer"]
    exec(program, {"CONNECTION": azurite_connection, "PREFIX": prefix, "KEY_ID": "shop",
                   "KEY": b"s" * 32})
    exec(program, {"CONNECTION": azurite_connection, "PREFIX": prefix, "KEY_ID": "shop",
                   "KEY": b"x" * 32})
    assert drain(bus, fail_fast=False)["orders"] == {"processed": 1, "poisoned": 1}
    assert state(bus, "orders", "signed-1", "order") == {"amount": 7, "note_size": 0}
    [letter] = bus.poisoned("orders").entries()
    assert letter.entry.reason == "bad signature (key 'shop')"
