"""One local SparkSession for every Spark test (starting one takes 5-30 s).

``local[2,3]``: two cores, and a failed task is retried (up to 3 attempts) as on a cluster.
The Python workers must run this interpreter and find this repository (the test contracts).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession



@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    from spark.session import local_session  # the sample jobs' session, the same settings

    session = local_session("bus-spark-tests", master="local[2,3]")
    yield session
    session.stop()
