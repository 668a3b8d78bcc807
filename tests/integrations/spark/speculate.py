"""A write whose slow task Spark copies speculatively, on a standalone cluster; run as its own
process by tests/integrations/spark/test_speculation.py (a process has one SparkContext, and the
other Spark tests' is a local one).

    python -m tests.integrations.spark.speculate MASTER CONNECTION_STRING PREFIX MARKERS VIA

Prints the write's result as JSON on its last line.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

ROWS_PER_PARTITION = 1200
PARTITIONS = 4


def main(master: str, connection_string: str, prefix: str, markers: Path, via: str) -> None:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import bus.spark
    from tests.integrations.spark.contracts import RecordSale
    from tests.integrations.spark.jobs import StallUntilCopied

    spark = (SparkSession.builder.master(master).appName("bus-speculation")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.executor.memory", "512m")
             .config("spark.executorEnv.PYTHONPATH", os.environ.get("PYTHONPATH", ""))
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             # A task is copied once half the stage is done and it has run 1.5 times the
             # median; checked every 100 ms.
             .config("spark.speculation", "true")
             .config("spark.speculation.interval", "100ms")
             .config("spark.speculation.quantile", "0.5")
             .config("spark.speculation.multiplier", "1.5")
             .config("spark.speculation.minTaskRuntime", "500ms")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    df = spark.range(0, ROWS_PER_PARTITION * PARTITIONS, 1, PARTITIONS).selectExpr(
        "concat('sale-', cast(id as string)) as sale_id", "cast(id as int) as amount")
    slow = df.mapInPandas(StallUntilCopied(markers), df.schema)
    options = {"connection_string": connection_string, "prefix": prefix}
    if via == "format":
        bus.spark.register(spark)
        (slow.write.format("bus").options(**options, destination="sink", key_column="sale_id",
                                          message_type="tests.integrations.spark.contracts:RecordSale")
         .mode("append").save())
        [result] = bus.spark.write_results(limit=1, **options)
    else:
        result = bus.spark.publish(slow, RecordSale, destination="sink", key_column="sale_id",
                                   **options)
    spark.stop()
    print(json.dumps(asdict(result)))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4]), sys.argv[5])
