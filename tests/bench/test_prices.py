"""The one price table, and the arithmetic from counted operations to USD."""

from __future__ import annotations

import pytest

from bench import prices

OPERATIONS = {
    "queue": ["create_queue", "send", "receive", "receive_empty", "delete", "extend", "depth"],
    "blob": ["create_container", "read", "write", "delete", "list"],
    "table": ["create_table", "get", "get_many", "insert", "replace", "delete", "transact",
              "query"],
}


def test_every_price_says_its_unit_source_and_date() -> None:
    table = prices.load()
    assert table.meta["checked"] and "verify" in table.meta["note"]
    for price in table.prices.values():
        assert price.unit and price.source and price.date and price.per > 0


def test_every_counted_operation_has_a_price() -> None:
    table = prices.load()
    for service, operations in OPERATIONS.items():
        for operation in operations:
            table.price_of(service, operation)


def test_an_unknown_operation_is_never_free() -> None:
    with pytest.raises(KeyError, match=r"no price for cosmos\.read"):
        prices.load().price_of("cosmos", "read")


def test_usd_per_million_units() -> None:
    table = prices.load()
    # $0.004 per 10k queue operations = $0.40 per million; $0.00036 per 10k table
    # transactions = $0.036 per million; blob deletes are free.
    assert table.usd_per_million({("queue", "send"): 1}) == pytest.approx(0.4)
    assert table.usd_per_million({("table", "transact"): 2, ("blob", "delete"): 5}) == \
        pytest.approx(0.072)
    assert table.usd_per_million({("queue", "delete"): 0.5, ("blob", "write"): 1}) == \
        pytest.approx(0.2 + 6.5)
