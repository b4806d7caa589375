"""How the checkpoints beside this file were made: with fissure as it was before its state codec
(revision a114cb2, whose workers pickled every state bare), a keyed count over one input file.

    git archive a114cb2 src | tar -x -C /tmp/old-fissure
    PYTHONPATH=/tmp/old-fissure/src ./dev python tests/data/legacy_state/make_fixture.py OUT a,b,c,d,e,a,b,a  # counts
    PYTHONPATH=/tmp/old-fissure/src ./dev python tests/data/legacy_state/make_fixture.py OUT trap,a            # trap

then OUT/checkpoint and OUT/input are copied here without Hadoop's .crc files. In `trap`, the
state of the key "trap" holds an object whose unpickling creates TRAP_MARKER (as one calling
os.system would run a command). tests/spark/state/test_spark_legacy_state.py resumes copies of them.
"""

import json
import os
import sys

import fissure
from fissure import MemorySink, Pipeline

TRAP_MARKER = "/tmp/fissure-legacy-state-trap-ran"


class Trap:
    def __reduce__(self):
        return (open, (TRAP_MARKER, "w"))


def count(state, record):
    state["n"] = state.get("n", 0) + 1
    if record["word"] == "trap":
        state["trap"] = Trap()
    return {"word": record["word"], "n": state["n"]}


def main() -> None:
    out, words = sys.argv[1], sys.argv[2].split(",")
    os.makedirs(os.path.join(out, "input"), exist_ok=True)
    with open(os.path.join(out, "input", "part-0.json"), "w") as file:
        file.writelines(json.dumps({"word": word}) + "\n" for word in words)
    pipeline = Pipeline("legacy").partitioned("count", count, key="word", schema={"word": str, "n": int})
    source = fissure.FileSource(os.path.join(out, "input"), format="json", schema={"word": str})
    fissure.run(pipeline, source, MemorySink(), checkpoint=os.path.join(out, "checkpoint"),
                config=fissure.RunnerConfig(master="local[2]", progress="off"))


if __name__ == "__main__":
    main()
