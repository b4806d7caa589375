"""The in-worker profiler: counts and timings per operator and graph piece, reported to the driver."""
