"""A run's life as pure decisions (no Spark, the clock passed in): restarts after failures, stalls, batch sizes, progress, and who holds a checkpoint."""
