"""One run of a program on Spark: `fissure.run`, the Runner and its query, the functions its workers run."""
