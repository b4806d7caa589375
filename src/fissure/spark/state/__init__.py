"""Keyed state on Spark: the handler Spark pickles, batched MapState requests, offline repartition."""
