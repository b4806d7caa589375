"""One query of a run on Spark: the Runner and its parts, the compiled plan, the functions workers run."""
