"""Statistics gathered while a pipeline runs: per-batch operator counts from the workers, their
aggregation over a window into the planner's operator statistics, the profile log and its views."""
