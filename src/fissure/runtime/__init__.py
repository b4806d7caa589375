"""What runs in Spark's Python workers and in `run_local` (no pyspark): records, operators, state, PE."""
