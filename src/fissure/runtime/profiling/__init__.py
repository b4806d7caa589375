"""The in-worker profiler: counts and timings per operator and per graph piece, and the report rows that carry them to the driver."""
