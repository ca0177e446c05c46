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
    from chaos import bench_controller

    controller_parser = bench_kinds.add_parser(
        "controller", help="controller failover, broker failover, topic creations/s",
        description="Start real clusters on loopback and time: kill -9 of the active "
                    "controller until a topic creation succeeds, kill -9 of a partition "
                    "leader until its partitions have new leaders, and topic creations per "
                    "second; next to the disk's fsync rate and (optionally) NATS JetStream.")
    bench_controller.add_arguments(controller_parser)
    controller_parser.set_defaults(handler=bench_controller.run)

    node = commands.add_parser(
        "node", help="run a node (broker, controller, or both) from a config file",
        description="Run one kraftlog node. process.roles in the config decides whether it "
                    "is a controller (a voter of the metadata quorum), a broker, or both. "
                    "SIGTERM/SIGINT stop it gracefully: a broker first moves its "
                    "partition leaderships away (controlled shutdown).")
    node.add_argument("--config", required=True, metavar="FILE",
                      help="TOML config file (see configs/single-node.toml)")
    node.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      dest="overrides",
                      help="override one config key, e.g. --set node.id=2 (repeatable)")
    node.set_defaults(handler=_run_node)

    quorum = commands.add_parser(
        "quorum", help="inspect the controller quorum",
        description="Inspect the Raft quorum of controllers that owns cluster metadata.")
    quorum_kinds = quorum.add_subparsers(dest="quorum_command", metavar="ACTION")
    quorum_kinds.required = True
    status = quorum_kinds.add_parser(
        "status", help="leader, term, commit index and every voter's lag",
        description="Show the quorum like kafka-metadata-quorum describe --status "
                    "--replication: leader, term, commit index, last applied, and each "
                    "voter's match index and lag behind the leader. Asks the broker at "
                    "--bootstrap (which asks the controllers) or a controller directly.")
    status.add_argument("--controller", metavar="URL",
                        help="ask this controller (its CONTROLLER listener) instead of a broker")
    status.add_argument("--json", action="store_true", help="print the raw JSON")
    status.set_defaults(handler=_quorum_status)
    return parser


def _run_node(args: argparse.Namespace) -> int:
    import asyncio

    from api.node import run_node
    from kraft.config import load_node_config
    from kraft.errors import InvalidConfigError

    try:
        config = load_node_config(args.config, args.overrides)
    except InvalidConfigError as exc:
        print(f"kraftlog node: {exc}", file=sys.stderr)
        return 2
    logging.getLogger().setLevel(logging.DEBUG if args.verbose else logging.INFO)
    for handler in logging.getLogger().handlers:
        handler.setFormatter(logging.Formatter(
            f"%(asctime)s node-{config.node_id} %(levelname)s %(name)s: %(message)s"))
    try:
        return asyncio.run(run_node(config))
    except OSError as exc:
        print(f"kraftlog node: cannot start: {exc}", file=sys.stderr)
        return 1


def _get_json(url: str, timeout_s: float = 10.0) -> object:
    import json
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.load(response)
    except urllib.error.HTTPError as exc:
        try:
            return json.load(exc)
        except ValueError:
            raise CliError(f"{url} answered HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise CliError(f"cannot reach {url}: {getattr(exc, 'reason', exc)}; is the node "
                       "running? (set --bootstrap or $KRAFTLOG_BOOTSTRAP)") from None


class CliError(Exception):
    """A failure to report in one line, exit status 1."""


def _quorum_status(args: argparse.Namespace) -> int:
    import json

    base = (args.controller or args.bootstrap).rstrip("/")
    status = _get_json(base + "/v1/quorum")
    if not isinstance(status, dict) or "error" in status:
        error = status.get("error", {}) if isinstance(status, dict) else {}
        print(f"kraftlog quorum status: {error.get('code')}: {error.get('message')}",
              file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(status, indent=2))
        return 0
    print(format_quorum_status(status))
    return 0


def format_quorum_status(status: dict) -> str:
    leader = status.get("leader_id")
    lines = [
        f"LeaderId:        {leader if leader is not None else 'none (election under way)'}",
        f"Term:            {status.get('term')}",
        f"CommitIndex:     {status.get('commit_index')}",
        f"LastApplied:     {status.get('last_applied')}",
        f"MetadataOffset:  {status.get('metadata_offset')}",
        f"AnsweredBy:      controller {status.get('node_id')} ({status.get('state')})",
        "",
    ]
    rows = [("NodeId", "Status", "Connected", "MatchIndex", "Lag", "Url")]
    for voter in status.get("voters", []):
        rows.append((
            str(voter["id"]),
            "Leader" if voter["id"] == leader else "Follower",
            "yes" if voter.get("connected") else "no",
            "-" if voter.get("match_index") is None else str(voter["match_index"]),
            "-" if voter.get("lag") is None else str(voter["lag"]),
            str(voter.get("url", "")),
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines += ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
              for row in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.handler(args) or 0)
    except CliError as exc:
        print(f"kraftlog: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
