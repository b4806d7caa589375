"""What runs in Spark's Python workers (and in `run_local`), no pyspark: records, the profiler, keyed state, operators, elastic threads, the processing element."""
