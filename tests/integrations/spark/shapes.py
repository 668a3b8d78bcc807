"""The ``bus`` stream reader as Spark 4.0 and 4.1 drive it, for a Spark 4.2+ test session.

Spark 4.0 and 4.1 call a Python stream reader's ``latestOffset()`` without arguments: their
worker (``pyspark/sql/streaming/python_streaming_source_runner.py`` of PySpark 4.1.4,
``latest_offset_func``) knows four calls only - ``initialOffset``, ``latestOffset()``,
``partitions(start, end)``, ``commit(end)`` - and their JVM side (``PythonMicroBatchStream``)
is a plain ``MicroBatchStream``: no admission control, no ``Trigger.AvailableNow`` (Spark
falls back to one batch, as for ``Trigger.Once``). PySpark 4.2+ still drives a reader that
way when its ``latestOffset`` takes no parameters (``check_support_func`` of the same module,
4.3.0): so this source, registered as ``bus_spark40``, is the bus reader under Spark 4.0/4.1's
calls in a PySpark 4.3 session. Importable by the Spark workers (they unpickle it).
"""

from __future__ import annotations

from typing import Any

from pyspark.sql.types import StructType

from bus.integrations.spark.options import read_options
from bus.integrations.spark.source import BusDataSource, BusStreamReader


class Spark40Source(BusDataSource):
    @classmethod
    def name(cls) -> str:
        return "bus_spark40"

    def streamReader(self, schema: StructType) -> Spark40StreamReader:  # noqa: N802
        return Spark40StreamReader(read_options(self.options, streaming=True))


class Spark40StreamReader(BusStreamReader):
    def latestOffset(self) -> dict[str, Any]:  # type: ignore[override]  # noqa: N802
        return super().latestOffset()
