"""A local SparkSession for the sample jobs, with the ``bus`` data source registered.

On a cluster (Databricks, Fabric) use the session you are given and call
``bus.spark.register(spark)``; this is for running the samples on one machine.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def local_session(name: str, master: str = "local[2,3]") -> Any:
    """Two cores, failed tasks retried (3 attempts); the workers run this interpreter and can
    import this repository (``spark.contracts``). ``format("bus")`` is registered where Spark
    has the Python Data Source API (4.0 on); Spark 3.x has ``bus.spark.publish/receive``.

    The environment the JVM starts with (which its Python workers inherit) is set for the
    start only: this process's own ``os.environ`` is as it was afterwards."""
    paths = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    launch = {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
              "SPARK_LOCAL_IP": os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"),  # loopback
              "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}
    from pyspark.sql import SparkSession

    import bus.spark

    before = {name: os.environ.get(name) for name in launch}
    os.environ.update(launch)
    try:
        spark = (SparkSession.builder.master(master).appName(name)
                 .config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false")
                 .config("spark.sql.shuffle.partitions", "2")
                 .config("spark.driver.memory", "1g")
                 .getOrCreate())
    finally:
        for variable, value in before.items():
            if value is None:
                os.environ.pop(variable, None)
            else:
                os.environ[variable] = value
    spark.sparkContext.setLogLevel("ERROR")
    if hasattr(spark, "dataSource"):
        bus.spark.register(spark)
    return spark


def connection_options(connection_string: str | None, account_name: str | None,
                       prefix: str) -> dict[str, str]:
    """The data source's connection options (one of the two, plus the prefix)."""
    if account_name:
        return {"account_name": account_name, "prefix": prefix}
    if not connection_string:
        raise SystemExit("give --connection-string (or set AzureWebJobsStorage) or "
                         "--account-name")
    return {"connection_string": connection_string, "prefix": prefix}
