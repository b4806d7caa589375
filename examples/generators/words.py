"""Lines of English-like text with a Zipf word distribution, for the word count example."""

from __future__ import annotations

import random

VOCABULARY = ("the of and to in a is that for it as was with be by on not he this are or his from at which but "
              "have an they you were her she there been one all we their has would when if so no will can more "
              "stream spark python operator state key record batch plan fission pipeline region replica").split()


def generate(lines: int, words_per_line: int = 12, seed: int = 3) -> list[str]:
    rng = random.Random(seed)
    weights = [1.0 / (rank + 1) for rank in range(len(VOCABULARY))]
    return [" ".join(rng.choices(VOCABULARY, weights, k=rng.randint(1, 2 * words_per_line)))
            for _ in range(lines)]
