"""Elastic threads inside a worker: the dynamic scheduler and the waiting operators that run on it."""
