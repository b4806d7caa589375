"""A program's run on Spark as one streaming query: `fissure.run` (run.py), the Runner that starts, watches and stops the query (runner.py and its parts), how a run ends (run_end.py)."""
