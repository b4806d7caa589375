"""Keyed state on Spark: the handler Spark pickles, a MapState's batched requests, and repartitioning a checkpoint's state offline."""
