"""Operators as the workers run them: fused, keyed, time-aware, combined, joined; watermarks, packing."""
