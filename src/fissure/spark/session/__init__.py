"""Starting Spark for fissure: the session, the driver's JVM and class archive, the worker daemon."""
