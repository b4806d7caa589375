"""Records as the workers carry them: fissure's own columns, Arrow rows as Python values, a source's rows, and a record's fate (dead letters)."""
