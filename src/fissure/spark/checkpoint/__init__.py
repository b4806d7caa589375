"""fissure's own files in a Spark checkpoint: the lock of one run at a time, what a start checks."""
