"""The control loops: one loop contract and the policies behind it; pure decisions, each with its reason."""
