"""One local SparkSession for every Spark test (starting one takes 5-30 s).

``local[2,3]``: two cores, and a failed task is retried (up to 3 attempts) as on a cluster.
The Python workers must run this interpreter and find this repository (the test contracts).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # stay on the loopback interface
    paths = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    os.environ["PYTHONPATH"] = os.pathsep.join(paths)
    from pyspark.sql import SparkSession

    import bus.spark

    session = (SparkSession.builder.master("local[2,3]").appName("bus-spark-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.driver.memory", "1g")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    bus.spark.register(session)
    yield session
    session.stop()
