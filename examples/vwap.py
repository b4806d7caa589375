"""VWAP: the volume-weighted average price per symbol over a sliding window of trades.

    ./dev python examples/vwap.py [--trades 50000] [--plan planner|sequential|FILE]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fissure  # noqa: E402
from fissure import Pipeline  # noqa: E402
from example_support import example_parser, print_run_summary, run_directory, run_for_people  # noqa: E402
from fissure.testing import record_files  # noqa: E402
from generators.trades import generate  # noqa: E402

TRADE = {"id": int, "ts": float, "symbol": str, "price": float, "volume": int}
WINDOW_S = 60.0


def valid(trade):
    return trade["price"] > 0 and trade["volume"] > 0


def notional(trade):
    return {**trade, "notional": trade["price"] * trade["volume"]}


def vwap(state, trade):
    """Sliding WINDOW_S window per symbol: the VWAP after each trade."""
    window = [item for item in state.get("window", []) if trade["ts"] - item[0] <= WINDOW_S]
    window.append((trade["ts"], trade["notional"], trade["volume"]))
    state["window"] = window
    volume = sum(item[2] for item in window)
    return {"id": trade["id"], "ts": trade["ts"], "symbol": trade["symbol"], "price": trade["price"],
            "vwap": sum(item[1] for item in window) / volume, "window_volume": volume}


def build_pipeline() -> Pipeline:
    return (Pipeline("vwap")
            .filter("valid", valid, reads=["price", "volume"], cost_us=1.0)
            .map("notional", notional, schema={**TRADE, "notional": float}, cost_us=2.0)
            .partitioned("vwap", vwap, key="symbol", order_by="ts", cost_us=20.0,
                         schema={"id": int, "ts": float, "symbol": str, "price": float, "vwap": float,
                                 "window_volume": int}))


def main(argv=None) -> int:
    parser = example_parser(__doc__, files=4)
    parser.add_argument("--trades", type=int, default=20_000)
    args = parser.parse_args(argv)
    directory = run_directory("vwap")
    trades = generate(args.trades)
    source = record_files(os.path.join(directory, "input"), trades, TRADE,
                          records_per_file=-(-len(trades) // args.files), max_files_per_trigger=1)
    sink = fissure.MemorySink()
    pipeline = build_pipeline()
    report = run_for_people(pipeline, source, sink, args, directory)
    print_run_summary(report, pipeline, directory, what="trades")
    latest = {}
    for record in sink.records():
        if record["ts"] >= latest.get(record["symbol"], {}).get("ts", -1):
            latest[record["symbol"]] = record
    print(f"latest {WINDOW_S:.0f} s VWAP per symbol:")
    for symbol, record in sorted(latest.items()):
        print(f"  {symbol:8s} last {record['price']:10.4f}  vwap {record['vwap']:10.4f}  volume {record['window_volume']:,}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
