"""Where records come from and go to on Spark: sources, sinks, file staging and batch sizes."""
