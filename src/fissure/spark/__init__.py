"""The Spark layer: the only place that imports pyspark (compiling plans, running queries)."""
