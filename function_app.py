"""The sample order flow, as an Azure Functions app (Python v2 programming model).

    PlaceOrder ──> orders ──(OrderPlaced)──> billing ──(OrderBilled)──> orders
                                        └──> shipping

Each handler is a plain function: it reads and writes its endpoint's state partition (a
Table Storage table per endpoint) and sends or publishes messages; the bus commits both
atomically and delivers every message's effect exactly once. ``BusFunctions`` registers the
queue trigger of each endpoint, the Durable outbox orchestration and the maintenance timer.

Run it with ``python -m devhost`` (this repository's local host) or ``func start``.

Telemetry (bus.hosting.functions.telemetry) is configured first, before the Bus exists:
Application Insights with ``APPLICATIONINSIGHTS_CONNECTION_STRING``, spans and metrics as JSON
lines in ``BUS_TRACE_DIR`` (``make demo DEMO_TRACES=dir``). The bus's settings are app settings
``BusFunctions`` reads (docs/configuration.md): ``BUS_PROCESS_SPAN_PARENT=message``, say,
parents each handler's ``process`` span on the message's creation (one trace from the client
to the last handler) instead of on the function invocation.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import azure.durable_functions as df

from bus import Command, Context, Endpoint, Event
from bus.hosting.functions import BusFunctions
from bus.hosting.functions.telemetry import configure_telemetry

logging.getLogger(__name__).info("telemetry: %s", configure_telemetry())


class PlaceOrder(Command):
    order_id: str
    customer: str
    amount_cents: int


class OrderPlaced(Event):
    order_id: str
    customer: str
    amount_cents: int


class OrderBilled(Event):
    order_id: str
    invoice_id: str


def count(row: Mapping[str, object] | None, field: str) -> int:
    """A counter kept in a state row: 0 when the row or the field does not exist yet."""
    value = (row or {}).get(field, 0)
    if not isinstance(value, int | str):
        raise TypeError(f"{field} is {value!r}, not a counter")
    return int(value)


orders = Endpoint("orders")
billing = Endpoint("billing")
shipping = Endpoint("shipping")


@orders.handles(PlaceOrder, partition=lambda m: m.order_id)
def place_order(message: PlaceOrder, ctx: Context) -> None:
    order = ctx.state.get("order") or {}
    order.update(customer=message.customer, amount_cents=message.amount_cents,
                 status="placed", placed=count(order, "placed") + 1)
    ctx.state.put("order", order)
    ctx.publish(OrderPlaced(order_id=message.order_id, customer=message.customer,
                            amount_cents=message.amount_cents))


@billing.handles(OrderPlaced, partition=lambda m: m.customer)
def bill_order(message: OrderPlaced, ctx: Context) -> None:
    # One partition per customer: the running balance and the invoice commit together.
    account = ctx.state.get("account")
    ctx.state.put("account", {"balance_cents": count(account, "balance_cents")
                              + message.amount_cents,
                              "invoices": count(account, "invoices") + 1})
    invoice = ctx.state.get(f"invoice-{message.order_id}")
    ctx.state.put(f"invoice-{message.order_id}",
                  {"amount_cents": message.amount_cents, "charged": count(invoice, "charged") + 1})
    ctx.publish(OrderBilled(order_id=message.order_id, invoice_id=f"inv-{message.order_id}"))


@shipping.handles(OrderPlaced, partition=lambda m: m.order_id)
def pack_order(message: OrderPlaced, ctx: Context) -> None:
    packed = count(ctx.state.get("shipment"), "packed")
    ctx.state.put("shipment", {"status": "packing", "packed": packed + 1})


@orders.handles(OrderBilled, partition=lambda m: m.order_id)
def mark_billed(message: OrderBilled, ctx: Context) -> None:
    order = ctx.state.get("order") or {}
    order.update(status="billed", invoice_id=message.invoice_id,
                 billed=count(order, "billed") + 1)
    ctx.state.put("order", order)


app = df.DFApp()
bus_functions = BusFunctions([orders, billing, shipping])
app.register_functions(bus_functions)
