"""One streaming query of a program: the plan compiled to Spark's operators, the functions shipped to the workers, the driver's clock, elastic threads and metrics."""
