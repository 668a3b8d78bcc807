"""Consumer: the OrderBilled topic streamed into a Parquet table, exactly once.

    python -m spark.stream_billed --table out/billed --checkpoint out/checkpoint \\
        --connection-string "$AzureWebJobsStorage" --subscribe --idle-seconds 30

The ``analytics`` endpoint is subscribed to the OrderBilled topic (``--subscribe``; do it once,
before the events are published). Each micro-batch is staged before Spark plans it, so a
restarted query replays the same messages; the Parquet sink commits each batch once. Stops
after ``--expect`` rows, after ``--idle-seconds`` without new rows, or at ``--timeout``.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import bus.spark
from spark.session import connection_options, local_session

ENDPOINT = "analytics"
TOPIC = "OrderBilled"
TABLE_SCHEMA = ("message_id string, order_id string, invoice_id string, correlation_id string, "
                "sent_at timestamp")


def start(spark: Any, table: Path, checkpoint: Path, options: dict[str, str], *,
          consumer: str = "billed-to-parquet", batch_size: int = 100) -> Any:
    """Start the query: bus -> Parquet (``order_id``, ``invoice_id`` and the envelope's ids)."""
    stream = (spark.readStream.format("bus").options(**options)
              .option("endpoint", ENDPOINT)
              .option("consumer", consumer)
              .option("message_type", "spark.contracts:OrderBilled")
              .option("batch_size", str(batch_size))
              .load())
    return (stream.select("message_id", "order_id", "invoice_id", "correlation_id", "sent_at")
            .writeStream.format("parquet")
            .option("path", str(table))
            .option("checkpointLocation", str(checkpoint))
            .trigger(processingTime="2 seconds")
            .start())


def rows_in(spark: Any, table: Path) -> int:
    """Rows committed to the table (the file sink's log names the committed files)."""
    if not (table / "_spark_metadata").exists():
        return 0
    return int(spark.read.schema(TABLE_SCHEMA).parquet(str(table)).count())


def run(spark: Any, table: Path, checkpoint: Path, options: dict[str, str], *,
        expect: int | None = None, idle_seconds: float = 30.0, timeout: float = 600.0,
        done: Callable[[], bool] = lambda: True,
        progress: Callable[[int], None] = lambda rows: None) -> int:
    """Run the query until ``expect`` rows are in (and ``done()`` says nothing more can come),
    or no row came for ``idle_seconds``, or ``timeout``; returns the rows in the table."""
    query = start(spark, table, checkpoint, options)
    started = last_change = time.monotonic()
    rows = 0
    try:
        while time.monotonic() - started < timeout:
            if query.awaitTermination(3):
                break  # failed or stopped: awaitTermination raised or returned
            now_rows = rows_in(spark, table)
            if now_rows != rows:
                rows, last_change = now_rows, time.monotonic()
            progress(rows)
            if expect is not None and rows >= expect and done():
                break
            if expect is None and time.monotonic() - last_change > idle_seconds:
                break
    finally:
        query.stop()
    return rows_in(spark, table)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m spark.stream_billed", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--table", type=Path, required=True)
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--subscribe", action="store_true",
                        help=f"subscribe the {ENDPOINT!r} endpoint to {TOPIC} first")
    parser.add_argument("--expect", type=int)
    parser.add_argument("--idle-seconds", type=float, default=30.0)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--connection-string", default=os.environ.get("AzureWebJobsStorage"))  # noqa: SIM112
    parser.add_argument("--account-name")
    parser.add_argument("--prefix", default=os.environ.get("BUS_PREFIX", ""))
    args = parser.parse_args()
    options = connection_options(args.connection_string, args.account_name, args.prefix)
    if args.subscribe:
        bus.spark.subscribe(ENDPOINT, [TOPIC], **options)
    spark = local_session("stream-billed")
    try:
        rows = run(spark, args.table, args.checkpoint, options, expect=args.expect,
                   idle_seconds=args.idle_seconds, timeout=args.timeout,
                   progress=lambda n: print(f"  {n} rows in {args.table}", flush=True))
        print(f"{rows} rows in {args.table}")
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
