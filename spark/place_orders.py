"""Producer: a dataset of orders, sent as PlaceOrder commands to the ``orders`` endpoint.

    python -m spark.place_orders --dataset orders.csv --generate 200 \\
        --connection-string "$AzureWebJobsStorage"

Each row becomes one PlaceOrder whose message id is a hash of its ``order_id`` (``key_column``)
scoped by the message type and destination, so running the job again - after a failure, or by
mistake - sends nothing twice. The executors send; the job's result (published, already sent,
refused) is read back with ``bus.spark.write_results``. ``--api publish`` does the same with
``bus.spark.publish`` (Spark 3.4+, e.g. Azure Synapse), which returns the result.
"""

from __future__ import annotations

import argparse
import csv
import os
from pathlib import Path
from typing import Any

import bus.spark
from bus.spark import PublishResult
from spark.contracts import PlaceOrder
from spark.session import connection_options, local_session

SCHEMA = "order_id string, customer string, amount_cents int"


def generate(path: Path, orders: int, customers: int = 50) -> Path:
    """Write a deterministic CSV of ``orders`` orders (the same file every time)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["order_id", "customer", "amount_cents"])
        for i in range(orders):
            out.writerow([f"order-{i:05d}", f"customer-{i % customers:04d}",
                          500 + (i * 37) % 9500])
    return path


def run(spark: Any, dataset: Path, options: dict[str, str], *, api: str = "datasource",
        destination: str = "orders") -> PublishResult:
    """Send every row of ``dataset``; returns the job's result."""
    df = spark.read.csv(str(dataset), header=True, schema=SCHEMA)
    if api == "publish":
        return bus.spark.publish(df, PlaceOrder, destination=destination,
                                 key_column="order_id", **options)
    (df.write.format("bus").options(**options)
     .option("message_type", "spark.contracts:PlaceOrder")
     .option("destination", destination)
     .option("key_column", "order_id")
     .mode("append").save())
    [result] = bus.spark.write_results(limit=1, **options)  # the job that just finished
    return result


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m spark.place_orders", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", type=Path, required=True)
    parser.add_argument("--generate", type=int, default=0,
                        help="first write a dataset of this many orders")
    parser.add_argument("--api", choices=["datasource", "publish"], default="datasource")
    parser.add_argument("--connection-string", default=os.environ.get("AzureWebJobsStorage"))  # noqa: SIM112
    parser.add_argument("--account-name")
    parser.add_argument("--prefix", default=os.environ.get("BUS_PREFIX", ""))
    args = parser.parse_args()
    if args.generate:
        generate(args.dataset, args.generate)
    options = connection_options(args.connection_string, args.account_name, args.prefix)
    spark = local_session("place-orders")
    try:
        result = run(spark, args.dataset, options, api=args.api)
        print(result)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
