"""``python -m bus contracts export`` and ``check``: the app's contracts as JSON Schema, and
which changes break a rolling deploy (consumers on either side of it)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import Field

from bus import Command, Event
from bus.messages import Message
from bus.operations.cli import main
from bus.operations.contracts_file import Comparison, compare, export

APP = '''
from typing import ClassVar
from bus import Bus, Command, Context, Endpoint, Event
from bus.testing import InMemoryStorage

class PlaceOrder(Command):
    order_id: str
    amount: int{fields}

class OrderPlaced(Event):
    order_id: str

class Audit(Command):
    """Sent to an endpoint elsewhere: named here, handled there."""
    what: str

orders = Endpoint("orders")

@orders.handles(PlaceOrder, partition=lambda m: m.order_id)
def place(message: PlaceOrder, ctx: Context) -> None:
    ctx.publish(OrderPlaced(order_id=message.order_id))

bus = Bus(InMemoryStorage(), [orders], routes={{Audit: "audit"}})
'''


@pytest.fixture
def shop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder with an app, ``shop_app``; ``release(name, fields)`` writes another."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AzureWebJobsStorage", "UseDevelopmentStorage=true")
    (tmp_path / "shop_app.py").write_text(APP.format(fields=""))
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("shop_app")]:
        sys.modules.pop(name)


def run(*args: str) -> Any:
    return CliRunner().invoke(main, list(args))


def test_export_writes_every_contract_the_app_handles_or_names(shop: Path) -> None:
    result = run("contracts", "export", "--app", "shop_app")
    assert result.exit_code == 0, result.output
    assert result.output == "wrote contracts.json (3 contracts)\n"
    document = json.loads((shop / "contracts.json").read_text())
    assert sorted(document["contracts"]) == ["Audit", "OrderPlaced", "PlaceOrder"]
    placed = document["contracts"]["PlaceOrder"]
    assert placed["kind"] == "command" and placed["aliases"] == []
    assert placed["class"] == "shop_app:PlaceOrder"
    assert placed["schema"]["required"] == ["order_id", "amount"]
    assert run("contracts", "export", "--app", "shop_app", "--out", "-").output == \
        (shop / "contracts.json").read_text()


def test_check_against_the_app_itself_passes(shop: Path) -> None:
    run("contracts", "export", "--app", "shop_app")
    result = run("contracts", "check", "contracts.json", "--app", "shop_app")
    assert result.exit_code == 0, result.output
    assert result.output == ("no breaking change from contracts.json to the contracts of "
                             "shop_app (0 compatible)\n")


@pytest.mark.parametrize(("fields", "code", "line"), [
    ("\n    gift_note: str = ''", 0,
     "compatible  PlaceOrder: field 'gift_note' added (optional)"),
    ("\n    gift_note: str", 1, "breaking    PlaceOrder: field 'gift_note' added as required: "
                                "copies from producers on the old code lack it and fail "
                                "validation"),
])
def test_check_of_a_new_release(shop: Path, fields: str, code: int, line: str) -> None:
    run("contracts", "export", "--app", "shop_app", "--out", "old.json")
    (shop / "shop_app_next.py").write_text(APP.format(fields=fields))
    run("contracts", "export", "--app", "shop_app_next", "--out", "new.json")
    result = run("contracts", "check", "old.json", "new.json")
    assert result.exit_code == code, result.output
    assert line in result.output.splitlines()


def test_check_fails_on_a_removed_required_field(shop: Path) -> None:
    run("contracts", "export", "--app", "shop_app", "--out", "old.json")
    (shop / "shop_app_next.py").write_text(
        APP.format(fields="").replace("    amount: int\n", ""))
    result = run("contracts", "check", "old.json", "--app", "shop_app_next")
    assert result.exit_code == 1
    assert ("breaking    PlaceOrder: field 'amount' removed, but the old contract requires "
            "it: consumers on the old code refuse copies without it") in result.output
    assert "1 breaking change(s) from old.json to the contracts of shop_app_next" in \
        result.output


@pytest.mark.parametrize(("content", "problem"), [
    ("not json", "old.json: not a JSON document"),
    ("{}", 'old.json: not a contracts file (no "contracts" object'),
    ('{"format": 2, "contracts": {}}', "old.json: format 2, this bus reads format 1"),
    ('{"format": 1, "contracts": {"A": {"kind": "query", "schema": {}}}}',
     "old.json: contract 'A' lacks a kind (command or event)"),
    ('{"format": 1, "contracts": {"A": {"kind": "event", "schema": {}, "aliases": [1]}}}',
     "old.json: contract 'A' lacks a kind (command or event), a schema or a list of aliases"),
    ('{"format": 1, "contracts": {"A": {"kind": "event", "schema": {"properties": "x"}}}}',
     "old.json: contract 'A' has a schema whose properties, $defs or required list is "
     "malformed"),
    ('{"format": 1, "contracts": {"A": {"kind": "event", "schema": {"required": "x"}}}}',
     "malformed"),
    ('[1, 2]', 'old.json: not a contracts file'),
])
def test_a_file_that_is_not_a_contracts_file_is_a_usage_error(
        shop: Path, content: str, problem: str) -> None:
    (shop / "old.json").write_text(content)
    result = run("contracts", "check", "old.json", "--app", "shop_app")
    assert result.exit_code == 2 and problem in result.output


def test_a_missing_file_is_a_usage_error(shop: Path) -> None:
    result = run("contracts", "check", "absent.json", "--app", "shop_app")
    assert result.exit_code == 2 and "absent.json: cannot be read" in result.output


def test_two_contracts_of_one_message_type_are_refused(shop: Path) -> None:
    (shop / "shop_app_twice.py").write_text(APP.format(fields="") + (
        "\nclass Again(Command):\n    message_type: ClassVar[str] = 'PlaceOrder'\n"))
    result = run("contracts", "export", "--app", "shop_app_twice", "--out", "-")
    assert result.exit_code == 2
    assert "both have the message type 'PlaceOrder'" in result.output


# -- the rules, contract by contract ------------------------------------------------------------
def changes(old: type[Message], new: type[Message]) -> Comparison:
    return compare(export([old]), export([new]))


class V1(Command):
    message_type: ClassVar[str] = "Order"
    order_id: str
    note: str = ""


class V1Strict(Command, extra="forbid"):
    message_type: ClassVar[str] = "Order"
    order_id: str
    note: str = ""


class V2Optional(Command):
    message_type: ClassVar[str] = "Order"
    order_id: str
    note: str = ""
    gift: bool = False


class V2Retyped(Command):
    message_type: ClassVar[str] = "Order"
    order_id: int
    note: str = ""


class V2Required(Command):
    message_type: ClassVar[str] = "Order"
    order_id: str
    note: str


class V2LessStrict(Command, extra="forbid"):
    message_type: ClassVar[str] = "Order"
    order_id: str


class V2Event(Event):
    message_type: ClassVar[str] = "Order"
    order_id: str
    note: str = ""


class Renamed(Command):
    aliases: ClassVar[tuple[str, ...]] = ("Order",)
    order_id: str
    note: str = ""


class RenamedOnly(Command):
    order_id: str
    note: str = ""


@pytest.mark.parametrize(("old", "new", "breaking", "compatible"), [
    (V1, V1, [], []),
    (V1, V2Optional, [], ["Order: field 'gift' added (optional)"]),
    (V1Strict, V2Optional, ["Order: field 'gift' added, and the old contract is strict: "
                            "consumers on the old code refuse copies that carry it"], []),
    (V1, V2Retyped, ["Order: field 'order_id' changed: {\"type\":\"string\"} -> "
                     "{\"type\":\"integer\"}"], []),
    (V1, V2Required, ["Order: field 'note' became required: copies from producers on the "
                      "old code may lack it"], []),
    (V2Required, V1, [], ["Order: field 'note' became optional"]),
    (V1, V2LessStrict, ["Order: field 'note' removed, and the new contract is strict: copies "
                        "from producers on the old code carry it and are refused"], []),
    (V1, V2Event, ["Order: kind changed, command -> event"], []),
    (V1, Renamed, [], ["Order: renamed Renamed (an alias keeps the old name)"]),
    (V1, RenamedOnly, ["Order: removed (copies still sent as Order, or waiting in a queue, "
                       "would be poisoned: keep it, or keep its name as an alias of the "
                       "contract that replaces it)"], ["RenamedOnly: added"]),
])
def test_what_breaks_a_rolling_deploy(old: type[Message], new: type[Message],
                                      breaking: list[str], compatible: list[str]) -> None:
    found = changes(old, new)
    assert (found.breaking, found.compatible) == (breaking, compatible)


def test_documentation_changes_break_nothing() -> None:
    class Documented(Command):
        """A docstring and field descriptions: the schema's title and description."""

        message_type: ClassVar[str] = "Order"
        order_id: str = Field(description="The order's id, as the shop shows it.")
        note: str = Field("", title="Note", examples=["leave at the door"])

    assert changes(V1, Documented) == Comparison()


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=6),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.sampled_from(
                        ["format", "contracts", "kind", "schema", "aliases", "properties",
                         "required", "$defs", "$ref", "type", "A", "x"]), inner, max_size=4),
                    max_leaves=12)


@settings(max_examples=150, deadline=None)
@given(old=JSON, new=JSON)
def test_whatever_two_files_hold_the_check_ends_in_an_answer_or_a_usage_error(
        tmp_path_factory: pytest.TempPathFactory, old: Any, new: Any) -> None:
    """Hostile files, as JSON: the check answers (0, 1) or says the file is not one (2),
    and never raises anything else."""
    folder = tmp_path_factory.mktemp("files")
    for name, document in (("old.json", old), ("new.json", new)):
        if isinstance(document, dict) and "contracts" in document:
            document.setdefault("format", 1)  # reach past the first check more often
        (folder / name).write_text(json.dumps(document))
    result = CliRunner().invoke(main, ["contracts", "check", str(folder / "old.json"),
                                       str(folder / "new.json")])
    assert result.exit_code in (0, 1, 2), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        repr(result.exception)
