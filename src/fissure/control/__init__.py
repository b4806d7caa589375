"""Control: pure decisions of the adaptive loop, each a frozen value that carries its reason."""
