"""Operators as the workers run them: fused stateless runs, keyed and time-aware operators, combining before the exchange, joins, watermarks, packed exchange."""
