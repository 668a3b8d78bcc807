"""Spark pipelines that send into and consume from the bus, exactly once (docs/spark.md).

Spark 4 (Python Data Source API)::

    import bus.spark
    bus.spark.register(spark)
    df.write.format("bus").option("message_type", "shop.contracts:PlaceOrder") \\
        .option("destination", "orders").option("key_column", "order_id") \\
        .option("connection_string", conn).mode("append").save()
    spark.readStream.format("bus").option("endpoint", "analytics") \\
        .option("consumer", "billed-to-parquet").option("connection_string", conn).load()

Spark 3.4 and 3.5 (Azure Synapse)::

    bus.spark.publish(df, PlaceOrder, destination="orders", key_column="order_id",
                      connection_string=conn)
    bus.spark.receive(spark, "analytics", run_key="2024-06-01", connection_string=conn)

Importing this package does not import pyspark; ``register`` does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bus.integrations.spark.compat import (
    commit_read,
    forget_read,
    publish,
    receive,
    subscribe,
    sweep_staging,
    write_results,
)
from bus.integrations.spark.options import OptionError
from bus.integrations.spark.writer import PublishResult, RowError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pyspark.sql import SparkSession

    from bus.messages import Message


def register(spark: SparkSession, contracts: Sequence[type[Message]] = ()) -> None:
    """Make ``format("bus")`` available in ``spark`` (Spark 4.0 or later). ``contracts``: the
    classes ``message_type`` may name by type name, such as those defined in a notebook."""
    if not hasattr(spark, "dataSource"):
        raise RuntimeError(f"the bus data source needs Spark 4.0 or later (the Python Data "
                           f"Source API); on Spark {spark.version} use bus.spark.publish and "
                           "bus.spark.receive")
    from bus.integrations.spark.source import register as _register

    _register(spark, contracts)


__all__ = ["OptionError", "PublishResult", "RowError", "commit_read", "forget_read", "publish",
           "receive", "register", "subscribe", "sweep_staging", "write_results"]
