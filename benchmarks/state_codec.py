"""What storing state as data costs against pickle: encode + decode of realistic states.

fissure stores operator state with its MessagePack codec (fissure.runtime.state.codec) unless an
operator asks for pickle. Measured here, per state, the time to encode and decode it (the header
and the decoding checks included) with that codec and with pickle (protocol 5), and the bytes:

- a word count's {"n": int};
- LogWatch's `range` state, {"failures": [20 floats]}, and its `breakins` state,
  {"failures": [20 (float, str) tuples]};
- a bucket's entry of 1,000 keys as fissure stores it (key text -> the key's state bytes), and the
  same 1,000 states as one dict.

Method: each measurement is the best of --repeats runs of a timed loop (timeit's advice for
micro-benchmarks: the minimum is the least disturbed run); the ratio codec / pickle per state.
Results: state_codec.md/.json under --out.

    ./dev python benchmarks/state_codec.py           # 5 repeats (about half a minute)
    ./dev python benchmarks/state_codec.py --quick   # one repeat, a temporary folder
"""

from __future__ import annotations

import argparse
import pickle
import random
import sys
import timeit
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY / "benchmarks"))

from fissure.runtime.state.codec import StateCodec, decode_data, encode_data  # noqa: E402
import method  # noqa: E402


def states() -> dict[str, object]:
    draw = random.Random(11)
    word_states = {f'["word-{number}"]': {"n": draw.randrange(1, 10_000)} for number in range(1_000)}
    return {
        "word count {n: int}": {"n": 12_345},
        "range: 20 floats": {"failures": [1.7e9 + draw.random() * 100 for _ in range(20)]},
        "breakins: 20 (float, str)": {"failures": [(1.7e9 + draw.random() * 100, f"10.0.0.{draw.randrange(255)}")
                                                   for _ in range(20)]},
        "entry of 1,000 keys (key -> state bytes)": {key: encode_data(state) for key, state in word_states.items()},
        "1,000 keys' states as one dict": word_states,
    }


def per_call_us(function, number: int, repeats: int) -> float:
    return min(timeit.repeat(function, number=number, repeat=repeats)) / number * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    method.add_arguments(parser, repeats=5)
    args = parser.parse_args(argv)
    repeats = 1 if args.quick else args.repeats
    run = method.Run("state_codec.py", argv, quick=args.quick, out=args.out)
    codec = StateCodec("bench")
    rows, document = [], {"repeats": repeats, "states": {}}
    for name, state in states().items():
        number = 200 if "1,000" in name else 20_000
        if args.quick:
            number //= 10
        sealed = codec.seal(encode_data(state))
        pickled = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
        assert decode_data(codec.unseal(sealed)[0]) == state and pickle.loads(pickled) == state
        data_us = per_call_us(lambda: decode_data(codec.unseal(codec.seal(encode_data(state)))[0]), number, repeats)
        pickle_us = per_call_us(lambda: pickle.loads(pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)),
                                number, repeats)
        document["states"][name] = {"data_us": data_us, "pickle_us": pickle_us, "data_bytes": len(sealed),
                                    "pickle_bytes": len(pickled)}
        rows.append(f"| {name} | {data_us:.2f} | {pickle_us:.2f} | {data_us / pickle_us:.2f} | {len(sealed):,} | "
                    f"{len(pickled):,} |")
        print(rows[-1], flush=True)
    text = "\n".join([
        "# State codec: encode + decode, MessagePack data against pickle", "",
        f"Best of {repeats} timed loops per state (µs per encode + decode, the header and its checks included).", "",
        "| state | data µs | pickle µs | data / pickle | data bytes | pickle bytes |",
        "| --- | --- | --- | --- | --- | --- |", *rows])
    run.write_results("state_codec", text, document)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
