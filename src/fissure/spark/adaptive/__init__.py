"""The loops around a running query on Spark: adaptive re-planning and live autopipelining."""
