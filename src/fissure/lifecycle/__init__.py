"""A run's lifecycle: restarts after failures, stalls, batch sizes, progress, checkpoint locks and logs."""
