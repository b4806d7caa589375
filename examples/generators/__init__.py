"""Input generators for the examples: realistic records of any size, shipped with the repository."""
