"""The examples in docs/ run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bus.adapters.azure import AzureStorage
from bus.testing import drain
from tests.orderflow import build, state

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
    ("operating.md", "routes"), ("operating.md", "read-state")])
def test_examples_run(azurite_connection: str, prefix: str, doc: str, title: str) -> None:
    program = examples(doc)[title]
    exec(program, {"STORAGE": AzureStorage.from_connection_string(azurite_connection),
                   "PREFIX": prefix, "__name__": "docs_example"})


def test_operating_md_has_its_examples() -> None:
    assert sorted(examples("operating.md")) == ["maintenance", "read-state", "routes"]
