"""Integrations of the bus with data platforms (optional extras; each imports its platform lazily).

* ``bus.integrations.spark`` - Apache Spark: a ``bus`` data source (Spark 4) and
  ``publish`` / ``receive`` functions (Spark 3.4+). See docs/spark.md.
"""
