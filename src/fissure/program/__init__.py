"""The program model a user builds: operators, the graph of them (a chain is a graph), windows, event time, aggregates and joins; no Spark, no runtime."""
