"""Message contracts of the Spark tests (imported by the Spark workers too: keep it tiny)."""

from __future__ import annotations

from bus import Command, Event


class RecordSale(Command):
    sale_id: str
    amount: int
    note: str | None = None


class SaleRecorded(Event):
    sale_id: str
    amount: int
