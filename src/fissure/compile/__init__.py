"""A plan compiled into the stages of one query and the pieces each stage runs (no pyspark)."""
