"""Starting Spark for fissure: the session and its settings, the driver's JVM and its class archive, the Python worker daemon, the stages Spark's REST API reports."""
