"""Keyed state as the workers keep it: how a key's state is encoded, and its layout in Spark's MapState entries."""
