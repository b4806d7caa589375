"""The loops around a running query on Spark: adaptive re-planning (queries, observations, switches, the batch gate) and live autopipelining."""
