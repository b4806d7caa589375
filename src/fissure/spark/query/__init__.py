"""One streaming query: the plan compiled to Spark's operators and the functions its workers run."""
