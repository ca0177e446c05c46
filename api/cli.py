"""The ``kraftlog`` command line.

Commands are added as their capabilities land; ``kraftlog --help`` lists
exactly what this build can do.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

DEFAULT_BOOTSTRAP = "http://127.0.0.1:9092"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kraftlog",
        description="kraftlog: a Kafka-style replicated commit log in Python.",
    )
    parser.add_argument(
        "--bootstrap", default=os.environ.get("KRAFTLOG_BOOTSTRAP", DEFAULT_BOOTSTRAP),
        help="broker URL to contact (default: $KRAFTLOG_BOOTSTRAP or %(default)s)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug detail")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True

    bench = commands.add_parser(
        "bench", help="measure performance (figures go to BENCHMARKS.md)",
        description="Benchmark programs. Each prints its figures next to a reference "
                    "measured in the same run.")
    bench_kinds = bench.add_subparsers(dest="bench_kind", metavar="KIND")
    bench_kinds.required = True
    from storage import bench as storage_bench

    storage_parser = bench_kinds.add_parser(
        "storage", help="partition log append/read/lookup/recovery vs raw disk writes",
        description="Append, sequential read, random offset lookup and unclean-restart "
                    "recovery of one partition log, next to a raw sequential file write "
                    "of the same bytes.")
    storage_bench.add_arguments(storage_parser)
    storage_parser.set_defaults(handler=storage_bench.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.handler(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
