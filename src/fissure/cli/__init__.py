"""The `fissure` command. Each subcommand lives in its own module with a `register(subparsers)`."""

from __future__ import annotations

import argparse
import importlib
import sys

# Subcommand modules, in the order `fissure --help` lists them.
SUBCOMMAND_MODULES = (
    "fissure.cli.plan_cmd",
    "fissure.cli.run_cmd",
    "fissure.cli.autopipeline_cmd",
    "fissure.cli.elastic_sim_cmd",
    "fissure.cli.profile_cmd",
    "fissure.cli.calibrate_cmd",
)


class UsageError(Exception):
    """Bad input the user can fix; printed without a traceback, exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fissure", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module_name in SUBCOMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except UsageError as error:
        print(f"fissure {args.command}: {error}", file=sys.stderr)
        return 2
