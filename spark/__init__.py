"""Sample Spark jobs on the bus (see README.md beside this file and docs/spark.md)."""
