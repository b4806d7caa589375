"""Pure throughput models of pipelined fission: no I/O, no Spark."""
