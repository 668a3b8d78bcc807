"""The messages the sample jobs exchange with the Functions sample app (function_app.py).

Declared again here rather than imported from function_app: a Spark job and a service agree on
a message's type name and fields, not on code (importing the app would start its settings on
every executor). ``message_type`` defaults to the class name: "PlaceOrder", "OrderBilled".
"""

from __future__ import annotations

from bus import Command, Event


class PlaceOrder(Command):
    order_id: str
    customer: str
    amount_cents: int


class OrderBilled(Event):
    order_id: str
    invoice_id: str
