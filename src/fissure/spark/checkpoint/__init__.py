"""fissure's own files in a Spark checkpoint: the lock that lets one run at a time, and what a start checks and keeps there."""
