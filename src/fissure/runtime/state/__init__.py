"""Keyed state as the workers keep it: its encoding, and its layout in Spark's MapState entries."""
