"""The ``kraftlog`` command line.

Commands are added as their capabilities land; ``kraftlog --help`` lists
exactly what this build can do.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from typing import Any

from api.cli_support import (DEFAULT_BOOTSTRAP, CliError, ExamplesFormatter,
                             add_security_arguments, at_active_controller, configure_security,
                             get_json)
from api.table import format_table

__all__ = ["DEFAULT_BOOTSTRAP", "CliError", "build_parser", "get_json", "main"]


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line. The benchmarks and the chaos harness are big
    and load what they measure, so their commands are built (and their
    modules imported) only when ``command`` is theirs; otherwise ``kraftlog
    --help`` still lists them."""
    parser = argparse.ArgumentParser(
        prog="kraftlog",
        description="kraftlog: a Kafka-style replicated commit log in Python.",
    )
    parser.add_argument(
        "--bootstrap", "--bootstrap-server", dest="bootstrap",
        default=os.environ.get("KRAFTLOG_BOOTSTRAP", DEFAULT_BOOTSTRAP),
        help="broker URL, or host:port, to contact; several comma-separated (default: "
             "$KRAFTLOG_BOOTSTRAP or %(default)s)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug detail")
    add_security_arguments(parser)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True

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
    node.add_argument("--print-config", action="store_true",
                      help="print the effective config (every key, its value and where it "
                           "came from: default, the file, or --set) and exit without "
                           "starting; docs/config.md describes every key")
    node.set_defaults(handler=_run_node)

    _add_cluster_commands(commands)
    from api import certs

    certs.add_commands(commands)

    from api import console

    console.add_commands(commands)


    web = commands.add_parser(
        "console", help="the web console's address (every broker serves it at /ui/)",
        description="Print the address of the web console the broker at --bootstrap serves "
                    "(http://BROKER/ui/: brokers, topics, messages, consumer groups), and "
                    "with --open, open it in this machine's browser.")
    web.add_argument("--open", action="store_true", help="open it in the default browser")
    web.set_defaults(handler=_web_console)

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
    add = quorum_kinds.add_parser(
        "add-controller", help="make a running controller a voter (KIP-853)",
        formatter_class=ExamplesFormatter,
        description="Add a controller to the voters, like kafka-metadata-quorum "
                    "add-controller. Start it first with `kraftlog node --config FILE` where "
                    "FILE sets its node.id, its CONTROLLER listener, controller.quorum.voters "
                    "= the current voters, controller.quorum.join = true and the cluster's "
                    "controller.quorum.secret.file. The active controller replicates the "
                    "metadata to it until it has every committed record, then adds it; the "
                    "change is in the Raft log, so every controller keeps it across restarts. "
                    "Needs ALTER on the CLUSTER on a secured cluster.\n\n"
                    "example:\n"
                    "  kraftlog quorum add-controller --bootstrap-controller "
                    "127.0.0.1:9093 \\\n"
                    "      --id 4 --address 127.0.0.1:9193")
    _add_controller_arguments(add)
    add.add_argument("--id", type=int, required=True, dest="node_id",
                     help="the new controller's node.id")
    add.add_argument("--address", metavar="HOST:PORT",
                     help="its CONTROLLER listener (what controller.quorum.voters names)")
    add.add_argument("--raft-address", metavar="HOST:PORT",
                     help="its Raft address (default: --address's port plus "
                          "controller.quorum.raft.port.offset); give at least one of the two")
    add.add_argument("--timeout-ms", type=int, default=30_000,
                     help="how long it may take to catch up (default %(default)s)")
    add.set_defaults(handler=_quorum_add_controller)
    remove = quorum_kinds.add_parser(
        "remove-controller", help="remove a controller from the voters (KIP-853)",
        formatter_class=ExamplesFormatter,
        description="Remove a controller from the voters, like kafka-metadata-quorum "
                    "remove-controller. The active controller can be removed: it hands "
                    "leadership to a caught-up voter, which removes it. The removed "
                    "controller keeps running as an observer until you stop it. The last "
                    "voter cannot be removed, and one change is made at a time. Needs ALTER "
                    "on the CLUSTER on a secured cluster.\n\n"
                    "example:\n"
                    "  kraftlog quorum remove-controller --bootstrap-controller "
                    "127.0.0.1:9093 --id 2")
    _add_controller_arguments(remove)
    remove.add_argument("--id", type=int, required=True, dest="node_id",
                        help="the node.id of the controller to remove")
    remove.set_defaults(handler=_quorum_remove_controller)
    from api import groups_cli

    groups_cli.add_commands(commands, ExamplesFormatter)
    from api import transactions_cli

    transactions_cli.add_commands(commands, ExamplesFormatter)
    from api import acls_cli, quotas_cli, tokens_cli, users_cli

    quotas_cli.add_commands(commands, ExamplesFormatter)
    users_cli.add_commands(commands, ExamplesFormatter)
    acls_cli.add_commands(commands, ExamplesFormatter)
    tokens_cli.add_commands(commands, ExamplesFormatter)
    if command == "bench":
        _add_bench_commands(commands)
    else:
        commands.add_parser("bench", help=BENCH_HELP)
    if command == "chaos":
        _add_chaos_commands(commands)
    else:
        commands.add_parser("chaos", help=CHAOS_HELP)
    return parser


BENCH_HELP = "measure performance (figures go to BENCHMARKS.md)"
CHAOS_HELP = "kill, pause and partition a real cluster; check nothing was lost"


def normalise_bootstrap(bootstrap: str, scheme: str = "http") -> str:
    """``host:port`` as Kafka's tools take it means ``http://host:port``
    (``https://`` with ``--security-protocol SSL``, which also turns an
    ``http://`` URL into ``https://``: an SSL command sends no plaintext).
    Several are comma-separated."""
    return ",".join(item if "://" in item and not (scheme == "https"
                                                   and item.startswith("http://"))
                    else f"{scheme}://{item.removeprefix('http://')}"
                    for item in (part.strip() for part in bootstrap.split(",")) if item)


def _command_of(argv: list[str]) -> str | None:
    """The subcommand ``argv`` names, past the global options."""
    args = iter(argv)
    for arg in args:
        if arg in ("--bootstrap", "--bootstrap-server"):
            next(args, None)
        elif not arg.startswith("-"):
            return arg
    return None


def _add_bench_commands(commands: argparse._SubParsersAction) -> None:
    bench = commands.add_parser(
        "bench", help=BENCH_HELP,
        description="Benchmark programs. Each prints its figures next to a reference "
                    "measured in the same run.")
    bench_kinds = bench.add_subparsers(dest="bench_kind", metavar="KIND")
    bench_kinds.required = True
    from bench import storage as storage_bench

    storage_parser = bench_kinds.add_parser(
        "storage", help="partition log append/read/lookup/recovery vs raw disk writes",
        description="Append, sequential read, random offset lookup and unclean-restart "
                    "recovery of one partition log, next to a raw sequential file write "
                    "of the same bytes.")
    storage_bench.add_arguments(storage_parser)
    storage_parser.set_defaults(handler=storage_bench.run)
    from bench import controller as bench_controller

    controller_parser = bench_kinds.add_parser(
        "controller", help="controller failover, broker failover, topic creations/s",
        description="Start real clusters on loopback and time: kill -9 of the active "
                    "controller until a topic creation succeeds, kill -9 of a partition "
                    "leader until its partitions have new leaders, and topic creations per "
                    "second; next to the disk's fsync rate and (optionally) NATS JetStream.")
    bench_controller.add_arguments(controller_parser)
    controller_parser.set_defaults(handler=bench_controller.run)
    from bench import data as bench_data

    for kind, summary, description in (
            ("produce", "producer throughput and acknowledgement latency",
             "Send --records records of --record-size bytes through the Python Producer to a "
             "fresh single node (or --brokers N: one controller and N brokers; or --target "
             "URL) and report records/s, MB/s and latency p50/p99/p99.9 from send to "
             "acknowledgement. --replication-factor and --min-insync-replicas shape the "
             "topic; --acks all waits for every in-sync replica."),
            ("consume", "consumer throughput reading a filled topic",
             "Fill a topic with --records records (not timed), then read them all back "
             "through the Python Consumer and report records/s and MB/s."),
            ("e2e", "end-to-end latency at a steady rate",
             "Produce at --rate records/s while a consumer in another process reads; report "
             "latency from send to the consumer's poll (p50/p99/p99.9).")):
        kind_parser = bench_kinds.add_parser(kind, help=summary, description=description)
        bench_data.add_arguments(kind_parser, kind)
        kind_parser.set_defaults(handler=bench_data.run)
    replication_parser = bench_kinds.add_parser(
        "replication", help="produce throughput, RF=3 acks=all next to RF=1 in one run",
        description="Start one fresh cluster (1 controller + 3 brokers) and produce the same "
                    "--records to a fresh topic per run: RF=1 acks=1 (the reference), RF=1 "
                    "acks=all, RF=3 acks=1 and RF=3 acks=all with min.insync.replicas=2. "
                    "--rounds rounds of the four, every other one in the opposite order; "
                    "each run's figures are its median round's. Print records/s, MB/s and "
                    "latency p50/p99 per run, and RF=3 acks=all throughput as a share of "
                    "RF=1 acks=1 in each round and in the median round (target, issue 25: "
                    "at least 0.80).")
    bench_data.add_arguments(replication_parser, "replication")
    replication_parser.set_defaults(handler=bench_data.run_replication)
    idempotence_parser = bench_kinds.add_parser(
        "idempotence", help="acks=all produce throughput with and without idempotence",
        description="Start one fresh node and produce the same --records with acks=all, "
                    "alternately without and with enable_idempotence, three rounds, each on "
                    "a fresh topic. Print the median records/s, MB/s and latency of each and "
                    "the idempotent / plain ratio (target: at least 0.90).")
    bench_data.add_arguments(idempotence_parser, "idempotence")
    idempotence_parser.set_defaults(handler=bench_data.run_idempotence)
    from bench import transactions as bench_transactions

    transactions_parser = bench_kinds.add_parser(
        "transactions", help="transactions of 100 and 10,000 records; read_committed reads",
        description="Start one fresh node; send --records records in transactions of --small "
                    "and then --large records through one transactional producer (records/s, "
                    "commit latency p50/p99); then read everything back with read_uncommitted "
                    "and read_committed consumers, alternately, three rounds (records/s, and "
                    "the read_committed / read_uncommitted ratio: target at least 0.90).")
    bench_transactions.add_arguments(transactions_parser)
    transactions_parser.set_defaults(handler=bench_transactions.run)
    from bench import security as bench_security

    security_parser = bench_kinds.add_parser(
        "security", help="produce and consume over TLS and TLS + SCRAM vs plaintext",
        description="Start three fresh single nodes: plain, TLS on both listeners with "
                    "client certificates required, and SASL_SSL with a SCRAM-SHA-512 user; "
                    "alternate rounds: produce --records into a fresh topic, read them back. "
                    "Print median records/s and each against plaintext (goal: at least 0.7).")
    bench_security.add_arguments(security_parser)
    security_parser.set_defaults(handler=bench_security.run)
    from bench import console as bench_console

    console_parser = bench_kinds.add_parser(
        "console", help="produce throughput with and without a web console tab open",
        description="Start one fresh node; alternate rounds: produce --records through "
                    "kraftlog's Producer with no console open, and with a headless chromium "
                    "showing the console's overview (it polls every 2 s). Print median "
                    "records/s and the ratio (goal: at least 0.95).")
    bench_console.add_arguments(console_parser)
    console_parser.set_defaults(handler=bench_console.run)
    from bench import scale as bench_scale

    scale_parser = bench_kinds.add_parser(
        "scale", help="costs at 12 partitions against 10,000: creation, metadata, "
                      "throughput, memory, restart, failover",
        description="Start a fresh cluster (1 controller + 3 brokers, shipped defaults). "
                    "With one topic of 12 partitions, then with --partitions more (topics "
                    "of 1 to 1,000 partitions, replication factor 3), measure: creating "
                    "them, a metadata change reaching every broker (p50/p99), produce and "
                    "consume of --records records spread over them, broker memory per "
                    "partition, a broker's restart after a clean stop and after kill -9, "
                    "and kill -9 of the broker leading the most partitions until every one "
                    "is writable again. Print both sizes side by side with the ratios and "
                    "issue 25's targets.")
    bench_scale.add_arguments(scale_parser)
    scale_parser.set_defaults(handler=bench_scale.run)
    from bench import flush as bench_flush

    flush_parser = bench_kinds.add_parser(
        "flush", help="produce rounds over many partitions, and how long until all of it "
                      "is fsynced",
        description="Start a fresh cluster (1 controller + 3 brokers, replication factor 3, "
                    "shipped defaults plus --set) with --partitions partitions. Produce "
                    "--records records spread over them --rounds times back to back "
                    "(records/s and the brokers' CPU of each), then wait until every broker "
                    "reports every log fsynced (kraftlog_log_unflushed_logs 0): how far the "
                    "disk lags the acknowledgements, and the CPU it takes. Run it with and "
                    "without --set log.flush.syncfs.min.logs=8 to compare.")
    bench_flush.add_arguments(flush_parser)
    flush_parser.set_defaults(handler=bench_flush.run)
    from bench import cores as bench_cores

    cores_parser = bench_kinds.add_parser(
        "cores", help="the replication path's CPU per partition, on the shipped cores alone",
        description="Three brokers' replication cores (with real logs under --dir) in this "
                    "one process, wired as the simulator wires them: --partitions partitions "
                    "led by broker 1 and followed by 2 and 3. Produce rounds of one batch per "
                    "partition (acks=all), carried until the followers hold the new high "
                    "watermark, then consumer rounds reading every partition from offset 0: "
                    "each core's CPU, microseconds per partition, and the answers and "
                    "per-partition entries the followers got. No sockets or event loop: the "
                    "cores' own cost, steadier run to run than bench scale's.")
    bench_cores.add_arguments(cores_parser)
    cores_parser.set_defaults(handler=bench_cores.run)
    from bench import kafka as bench_kafka

    kafka_parser = bench_kinds.add_parser(
        "kafka", help="Kafka's clients through the KAFKA listener vs the HTTP/msgpack path",
        description="Start one fresh node with a KAFKA listener; alternate rounds: produce "
                    "--records through confluent-kafka (librdkafka) and through kraftlog's "
                    "Producer, each into a fresh topic, then read them back the same way. "
                    "Print median records/s and the Kafka listener against the HTTP path "
                    "(goal: at least 0.7 both ways).")
    bench_kafka.add_arguments(kafka_parser)
    kafka_parser.set_defaults(handler=bench_kafka.run)
    from bench import compaction as bench_compaction

    compaction_parser = bench_kinds.add_parser(
        "compaction", help="the log cleaner: MiB/s against a raw copy; produce while it runs",
        description="Build a compacted log of --mb MiB with --keys keys (not timed) and clean "
                    "it, alternating with a raw read + write + fsync of the same bytes (goal: "
                    "the cleaner at least 0.3x the raw copy). Then start a fresh node and time "
                    "producing --records records while nothing is cleaned, while a --dirty-mb "
                    "MiB topic is compacted, and idle again (goal: at least 0.8x of idle).",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_compaction.add_arguments(compaction_parser)
    compaction_parser.set_defaults(handler=bench_compaction.run)
    from bench import failover as bench_failover

    failover_parser = bench_kinds.add_parser(
        "failover", help="acks=all unavailability after kill -9 of a partition leader",
        description="Start a fresh cluster (1 controller + 3 brokers), create a topic with "
                    "one partition, replication factor 3 and min.insync.replicas=2, and "
                    "write one acks=all record at a time. Kill -9 the partition leader and "
                    "time until a write is acknowledged by the new leader; restart the "
                    "killed broker and wait for the full ISR; repeat --trials times. Print "
                    "each window and p50/p99/max next to the target: p50 <= 2 s and "
                    "p99 <= 3 s with the shipped defaults.")
    bench_failover.add_arguments(failover_parser)
    failover_parser.set_defaults(handler=bench_failover.run)
    from bench import clients as bench_clients

    clients_parser = bench_kinds.add_parser(
        "clients", help="one broker with 10 and with 1,000 clients: produce latency, fds, "
                        "memory",
        description="Start a fresh cluster (1 controller + 1 broker), create a topic, and "
                    "run two rounds of the same load (--rate records/s of 100 bytes, acks=1) "
                    "with --reference-clients and with --clients clients, half async "
                    "producers and half long-polling async consumers, over --processes "
                    "worker processes. Print per round the broker's connections, file "
                    "descriptors, memory and CPU, records produced and consumed per second, "
                    "and produce latency p50/p99/max (target: p99 <= 50 ms with 1,000 "
                    "clients).")
    bench_clients.add_arguments(clients_parser)
    clients_parser.set_defaults(handler=bench_clients.run)
    from bench import groups as bench_groups

    groups_parser = bench_kinds.add_parser(
        "groups", help="consumer group rebalance time and group consume throughput",
        description="Start a fresh cluster (1 controller + 3 brokers), fill a 6-partition "
                    "topic, read it all with a group of 1 and of 3 members (records/s), then "
                    "time a member joining and leaving a group of two until the group is "
                    "stable again (p50, max; target: under 1 s plus the heartbeat interval).")
    bench_groups.add_arguments(groups_parser)
    groups_parser.set_defaults(handler=bench_groups.run)
    from bench import rebalance as bench_rebalance

    rebalance_parser = bench_kinds.add_parser(
        "rebalance", help="rebalance time of a large group (100 members, 1,000 partitions)",
        description="Start a fresh cluster (1 controller + 3 brokers, shipped defaults), "
                    "create a topic of --partitions partitions (RF 3), start --members group "
                    "members over --processes worker processes, then --trials times time a "
                    "member joining and leaving until every partition is owned by exactly "
                    "one member (as the members see it) and the coordinator says stable "
                    "(p50, p99, max; target: p99 <= 2 s). Fails if any partition was held "
                    "by two members at once.")
    bench_rebalance.add_arguments(rebalance_parser)
    rebalance_parser.set_defaults(handler=bench_rebalance.run)
    from bench import spark as bench_spark

    spark_parser = bench_kinds.add_parser(
        "spark", help="PySpark format(\"kraftlog\") batch read vs Parquet; streaming latency",
        description="Fill a topic on a fresh single node (or --target URL) and, in one local "
                    "SparkSession (local[2]): read the whole topic through "
                    "format(\"kraftlog\") into the noop sink --repeats times, then the same "
                    "rows from a local Parquet copy, and print median and best records/s "
                    "and MB/s and the kraftlog/Parquet ratio (target: at least 0.5). Then "
                    "produce --rate records/s for --seconds s while a streaming query "
                    "(startingOffsets latest, foreachBatch) reads them: records seen (must "
                    "equal records produced), latency p50/p99/max from the record timestamp "
                    "to foreachBatch, and micro-batch duration p50/p99.")
    bench_spark.add_arguments(spark_parser)
    spark_parser.set_defaults(handler=bench_spark.run)


def _add_chaos_commands(commands: argparse._SubParsersAction) -> None:
    from chaos import chaos_cli

    chaos = commands.add_parser(
        "chaos", help=CHAOS_HELP,
        formatter_class=ExamplesFormatter,
        description="Jepsen-style fault injection against real kraftlog processes. "
                    "`chaos run` starts a fresh cluster, writes unique values with "
                    "acks=all while a seeded nemesis kills, pauses and partitions nodes, "
                    "heals everything, reads every partition back and checks that no "
                    "acknowledged write was lost, reordered or changed. See docs/chaos.md.",
        epilog="examples:\n"
               "  kraftlog chaos scenarios\n"
               "  kraftlog chaos run --scenario kill-leader --duration 60 --seed 1 "
               "--out /tmp/chaos-kill\n"
               "  kraftlog chaos check /tmp/chaos-kill")
    actions = chaos.add_subparsers(dest="chaos_command", metavar="ACTION")
    actions.required = True
    chaos_cli.add_commands(actions, ExamplesFormatter)


def _add_cluster_commands(commands: argparse._SubParsersAction) -> None:
    examples = ExamplesFormatter
    cluster = commands.add_parser(
        "cluster", help="run a local multi-process cluster (up, down, status)",
        formatter_class=examples,
        description="Run a whole cluster on this machine, one `kraftlog node` process per "
                    "node, on free loopback ports. Everything lives in one directory: "
                    "DIR/cluster.json (every node's id, roles, URLs, pid and config file), "
                    "DIR/node-<id>.toml (restart one node alone with `kraftlog node --config "
                    "DIR/node-<id>.toml`), DIR/node-<id>.log and DIR/node-<id>/ (its data).",
        epilog="examples:\n"
               "  kraftlog cluster up --dir /tmp/kl        # 3 controllers + 3 brokers\n"
               "  kraftlog cluster status --dir /tmp/kl\n"
               "  kraftlog cluster down --dir /tmp/kl      # keeps the data; `up` restarts it\n"
               "  kraftlog cluster down --dir /tmp/kl --purge")
    actions = cluster.add_subparsers(dest="cluster_command", metavar="ACTION")
    actions.required = True
    dir_help = "the cluster's directory (configs, logs, data, cluster.json)"

    up = actions.add_parser(
        "up", help="start a new cluster, or the stopped nodes of an existing one",
        formatter_class=examples,
        description="Start a cluster in DIR and wait until it serves: an active controller "
                    "exists and every broker reports state \"running\". A new DIR gets 3 "
                    "dedicated controllers and 3 dedicated brokers unless --controllers/"
                    "--brokers or --combined say otherwise. On a DIR that already holds a "
                    "cluster, nodes that are stopped start again on their data, ports and "
                    "configs; running nodes are left alone. Nodes run detached (they outlive "
                    "this command); their output goes to DIR/node-<id>.log. Every broker "
                    "also speaks Kafka's protocol on a KAFKA listener: the printed "
                    "bootstrap.servers is for Kafka clients (kcat, confluent-kafka...).",
        epilog="examples:\n"
               "  kraftlog cluster up --dir /tmp/kl\n"
               "  kraftlog cluster up --dir /tmp/kl1 --combined 1\n"
               "  kraftlog cluster up --dir /tmp/kl5 --controllers 3 --brokers 5 \\\n"
               "      --set num.partitions=6 --set log.retention.ms=3600000\n"
               "  kraftlog cluster up --dir /tmp/kls --combined 1 --secure\n"
               "  export KRAFTLOG_BOOTSTRAP=<the broker URL it prints>")
    up.add_argument("--dir", required=True, metavar="DIR", help=dir_help)
    up.add_argument("--controllers", type=int, metavar="N",
                    help="dedicated controllers, ids 1..N (default 3)")
    up.add_argument("--brokers", type=int, metavar="M",
                    help="dedicated brokers, ids N+1..N+M (default 3)")
    up.add_argument("--combined", type=int, metavar="N",
                    help="instead, N nodes that are each controller and broker")
    up.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    dest="overrides",
                    help="a config setting for every node, written into its TOML, e.g. "
                         "--set broker.session.timeout.ms=1500 (repeatable; only for a new "
                         "cluster)")
    up.add_argument("--timeout-s", type=float, default=60.0, metavar="S",
                    help="give up waiting for the cluster after S seconds (default "
                         "%(default)g); the nodes keep running")
    up.add_argument("--secure", action="store_true",
                    help="a new cluster with TLS on every listener and client certificates "
                         "required: makes a CA, node and client certificates in DIR/certs "
                         "(kept across restarts) and prints the KRAFTLOG_SECURITY_PROTOCOL / "
                         "KRAFTLOG_SSL_* variables the CLI needs. A cluster made with it "
                         "stays TLS on later `up`s without it; a cluster made without it "
                         "cannot be switched (use a new --dir)")
    up.set_defaults(handler=_cluster)

    down = actions.add_parser(
        "down", help="stop every node; keep the data (--purge deletes it)",
        formatter_class=examples,
        description="Stop every running node of the cluster in DIR: SIGTERM (brokers first, "
                    "which move their partition leaderships away), then SIGKILL for any "
                    "still running after --timeout-s. A recorded pid is only signalled while "
                    "it still runs that node's config. Data, configs and cluster.json stay, "
                    "so `kraftlog cluster up --dir DIR` restarts the same cluster.",
        epilog="examples:\n"
               "  kraftlog cluster down --dir /tmp/kl\n"
               "  kraftlog cluster down --dir /tmp/kl --purge   # and delete /tmp/kl")
    down.add_argument("--dir", required=True, metavar="DIR", help=dir_help)
    down.add_argument("--timeout-s", type=float, default=30.0, metavar="S",
                      help="SIGKILL nodes still running after S seconds (default %(default)g)")
    down.add_argument("--purge", action="store_true",
                      help="then delete DIR: data, configs, logs and cluster.json")
    down.set_defaults(handler=_cluster)

    status = actions.add_parser(
        "status", help="every node's pid, URLs and live state; the active controller",
        formatter_class=examples,
        description="Show each node of the cluster in DIR with its live state: a broker's "
                    "lifecycle state from GET <broker_url>/healthz (running, fenced, ...), "
                    "whether a controller is the active one, or \"down\" when its process "
                    "is not running. Then the active controller, from GET /v1/quorum.",
        epilog="examples:\n"
               "  kraftlog cluster status --dir /tmp/kl\n"
               "  kraftlog cluster status --dir /tmp/kl --json | jq '.nodes[].state'")
    status.add_argument("--dir", required=True, metavar="DIR", help=dir_help)
    status.add_argument("--json", action="store_true",
                        help="print cluster.json's nodes with live state and /v1/quorum as JSON")
    status.set_defaults(handler=_cluster)


def _cluster(args: argparse.Namespace) -> int:
    from chaos import local_cluster

    try:
        if args.cluster_command == "up":
            return local_cluster.cluster_up(
                args.dir, controllers=args.controllers, brokers=args.brokers,
                combined=args.combined, set_items=args.overrides, timeout_s=args.timeout_s,
                secure=args.secure)
        if args.cluster_command == "down":
            return local_cluster.cluster_down(args.dir, timeout_s=args.timeout_s,
                                              purge=args.purge)
        return local_cluster.cluster_status(args.dir, as_json=args.json)
    except local_cluster.ClusterError as exc:
        print(f"kraftlog cluster {args.cluster_command}: {exc}", file=sys.stderr)
        return 1


def _run_node(args: argparse.Namespace) -> int:
    import asyncio

    from api.node import run_node
    from kraft.config import load_node_config, print_config
    from protocol.errors import InvalidConfigError

    try:
        config = load_node_config(args.config, args.overrides)
    except InvalidConfigError as exc:
        print(f"kraftlog node: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        print(print_config(config))
        return 0
    logging.getLogger().setLevel(logging.DEBUG if args.verbose else logging.INFO)
    for handler in logging.getLogger().handlers:
        handler.setFormatter(logging.Formatter(
            f"%(asctime)s node-{config.node_id} %(levelname)s %(name)s: %(message)s"))
    try:
        return asyncio.run(run_node(config))
    except OSError as exc:
        print(f"kraftlog node: cannot start: {exc}", file=sys.stderr)
        return 1


def _web_console(args: argparse.Namespace) -> int:
    url = args.bootstrap.split(",")[0].strip().rstrip("/") + "/ui/"
    print(url)
    if args.open:
        import webbrowser
        if not webbrowser.open(url):
            raise CliError(f"no browser could be started here: open {url} yourself")
    return 0


def _quorum_status(args: argparse.Namespace) -> int:
    import json

    base = (args.controller or args.bootstrap).rstrip("/")
    status = get_json(base + "/v1/quorum")
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


def _add_controller_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap-controller", "--controller", dest="controllers",
                        required=True, metavar="HOST:PORT[,...]",
                        help="one or more controllers (CONTROLLER listeners); the change is "
                             "sent to the active one")
    parser.add_argument("--json", action="store_true", help="print the raw JSON answer")


#: How long a membership command follows NOT_CONTROLLER hints and elections.
CONTROLLER_COMMAND_TIMEOUT_S = 60.0


def _at_active_controller(args: argparse.Namespace, path: str, body: dict,
                          timeout_s: float) -> dict:
    """``at_active_controller`` among ``--bootstrap-controller``."""
    scheme = "https" if args.security_protocol in ("SSL", "SASL_SSL") else "http"
    return at_active_controller(normalise_bootstrap(args.controllers, scheme).split(","),
                                path, body, timeout_s)


def _print_voters(args: argparse.Namespace, answer: dict, what: str) -> None:
    import json

    if args.json:
        print(json.dumps(answer, indent=2))
        return
    print(what)
    print(format_table(("NodeId", "RaftAddress", "Url"),
                       [(str(v["id"]), v["raft_address"], str(v.get("url") or ""))
                        for v in answer.get("voters", [])]))


def _quorum_add_controller(args: argparse.Namespace) -> int:
    if not args.address and not args.raft_address:
        raise CliError("give --address (the new controller's CONTROLLER listener) or "
                       "--raft-address")
    body = {"node_id": args.node_id, "timeout_ms": args.timeout_ms}
    if args.address:
        body["address"] = args.address
    if args.raft_address:
        body["raft_address"] = args.raft_address
    answer = _at_active_controller(args, "/v1/controller/quorum/add-voter", body,
                                   CONTROLLER_COMMAND_TIMEOUT_S + args.timeout_ms / 1000)
    _print_voters(args, answer, f"controller {args.node_id} is a voter; voters now:")
    return 0


def _quorum_remove_controller(args: argparse.Namespace) -> int:
    answer = _at_active_controller(args, "/v1/controller/quorum/remove-voter",
                                   {"node_id": args.node_id}, CONTROLLER_COMMAND_TIMEOUT_S)
    _print_voters(args, answer, f"controller {args.node_id} is no longer a voter; voters now:")
    return 0


def format_quorum_status(status: dict) -> str:
    leader = status.get("leader_id")
    lines = [
        f"LeaderId:        {leader if leader is not None else 'none (election under way)'}",
        f"Term:            {status.get('term')}",
        f"CommitIndex:     {status.get('commit_index')}",
        f"LastApplied:     {status.get('last_applied')}",
        f"MetadataOffset:  {status.get('metadata_offset')}",
        f"AnsweredBy:      controller {status.get('node_id')} ({status.get('state')}"
        + ("" if status.get("voter", True) else ", an observer: not a voter") + ")",
    ]
    if status.get("pending_voter_change") is not None:
        lines.append(f"PendingChange:   a voter change at Raft index "
                     f"{status['pending_voter_change']} is not committed yet")
    lines.append("")
    rows = []
    for voter in status.get("voters", []):
        rows.append((
            str(voter["id"]),
            "Leader" if voter["id"] == leader else "Follower",
            "yes" if voter.get("connected") else "no",
            "-" if voter.get("match_index") is None else str(voter["match_index"]),
            "-" if voter.get("lag") is None else str(voter["lag"]),
            str(voter.get("url", "")),
        ))
    lines.append(format_table(("NodeId", "Status", "Connected", "MatchIndex", "Lag", "Url"),
                              rows))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(_command_of(argv))
    args = parser.parse_args(argv)
    args.bootstrap = normalise_bootstrap(
        args.bootstrap, "https" if args.security_protocol in ("SSL", "SASL_SSL") else "http")
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "bench":
        # A benchmark stopped with kill (SIGTERM) unwinds as from Ctrl-C,
        # so the cluster it started is stopped, not left running.
        signal.signal(signal.SIGTERM, _interrupt)
        if isinstance(getattr(args, "dir", None), str):
            os.makedirs(args.dir, exist_ok=True)  # each makes its run's directory in it
    try:
        configure_security(args)
        from api.console import resolve_topic_arguments

        resolve_topic_arguments(args)
        return int(args.handler(args) or 0)
    except CliError as exc:
        print(f"kraftlog: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    # Run the importable module's main, not this __main__ copy: commands in
    # other modules raise api.cli.CliError, which only that copy catches.
    from api.cli import main as _main

    sys.exit(_main())
