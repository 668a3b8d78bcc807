"""Pricing counted storage operations with the one price table, ``bench/prices.toml``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomllib

PRICES = Path(__file__).resolve().parent / "prices.toml"


@dataclass(frozen=True)
class Price:
    name: str
    usd: float
    per: int
    unit: str
    source: str
    date: str

    @property
    def per_operation(self) -> float:
        return self.usd / self.per


@dataclass(frozen=True)
class PriceTable:
    prices: dict[str, Price]
    operations: dict[str, str]
    """``service.operation`` (or ``service.*``) -> price name."""
    meta: dict[str, str]

    def price_of(self, service: str, operation: str) -> Price:
        name = (self.operations.get(f"{service}.{operation}")
                or self.operations.get(f"{service}.*"))
        if name is None:
            # Never price an unknown operation as free: say which one to add.
            raise KeyError(f"no price for {service}.{operation}: add it to [operations] "
                           f"in {PRICES.name}")
        return self.prices[name]

    def usd_per_million(self, ops_per_unit: Mapping[tuple[str, str], float]) -> float:
        """USD per million units (hops, deliveries) given the operations one unit takes."""
        return sum(count * self.price_of(service, op).per_operation
                   for (service, op), count in ops_per_unit.items()) * 1_000_000


def load(path: Path = PRICES) -> PriceTable:
    with path.open("rb") as f:
        data: dict[str, Any] = tomllib.load(f)
    prices = {name: Price(name=name, usd=float(p["usd"]), per=int(p["per"]), unit=p["unit"],
                          source=p["source"], date=p["date"])
              for name, p in data["prices"].items()}
    operations = dict(data["operations"])
    unknown = set(operations.values()) - set(prices)
    if unknown:
        raise ValueError(f"{path.name}: [operations] names unknown prices {sorted(unknown)}")
    return PriceTable(prices, operations, dict(data["meta"]))
