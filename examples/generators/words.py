"""Lines of English-like text with a Zipf word distribution, for the word count example."""

from __future__ import annotations

import random

VOCABULARY = ("the of and to in a is that for it as was with be by on not he this are or his from at which but "
              "have an they you were her she there been one all we their has would when if so no will can more "
              "stream spark python operator state key record batch plan fission pipeline region replica").split()


def vocabulary(size: int | None = None) -> list[str]:
    """The words in rank order: the built-in ones, then `w<rank>` up to `size` words."""
    if size is None or size <= len(VOCABULARY):
        return list(VOCABULARY[:size])
    return list(VOCABULARY) + [f"w{rank}" for rank in range(len(VOCABULARY), size)]


def generate(lines: int, words_per_line: int = 12, seed: int = 3, vocabulary_size: int | None = None,
             fixed_length: bool = False) -> list[str]:
    """`lines` lines of words drawn with Zipf weights (1 / rank) from a vocabulary of
    `vocabulary_size` words (default: the built-in ones); a line has `words_per_line` words, or
    1 to twice that many at random unless `fixed_length`."""
    rng = random.Random(seed)
    words = vocabulary(vocabulary_size)
    cumulative, total = [], 0.0
    for rank in range(len(words)):
        total += 1.0 / (rank + 1)
        cumulative.append(total)
    return [" ".join(rng.choices(words, cum_weights=cumulative,
                                 k=words_per_line if fixed_length else rng.randint(1, 2 * words_per_line)))
            for _ in range(lines)]
