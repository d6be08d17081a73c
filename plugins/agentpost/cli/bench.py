"""`agentpost bench SUITE`: run a benchmark (`agentpost.benchmarks`) and print its numbers.
A suite's module, with whatever it compares against, is imported only when it runs."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from agentpost.benchmarks import SUITES, run_benchmark
from agentpost.cli.common import EXIT_USAGE


def cmd_bench(args: argparse.Namespace) -> int:
    if args.large and args.suite != "growth":
        print("agentpost: --large is for `agentpost bench growth` only", file=sys.stderr)
        return EXIT_USAGE
    return run_benchmark(args.suite, dsn=args.dsn, scale=args.scale, large=args.large)


def register(sub: Any) -> None:
    bench = sub.add_parser("bench", help="run a benchmark and print its numbers")
    bench.add_argument("suite", choices=sorted(SUITES))
    bench.add_argument("--scale", type=float, default=1.0,
                       help="multiply the number of operations measured")
    bench.add_argument("--large", action="store_true",
                       help="growth only: also fill the store to 10M envelopes")
    bench.set_defaults(func=cmd_bench)
