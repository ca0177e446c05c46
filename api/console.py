"""``kraftlog topics|partitions|produce|consume``: Kafka's console tools, for kraftlog.

  kraftlog topics create|list|describe|alter|delete   (kafka-topics)
  kraftlog partitions reassign|reassignments          (kafka-reassign-partitions)
  kraftlog partitions elect-leaders                   (kafka-leader-election)
  kraftlog produce TOPIC                               (kafka-console-producer)
  kraftlog consume TOPIC                               (kafka-console-consumer)

Every command talks to the broker at ``--bootstrap`` through the Python
client (``api.client``), as any program would. Failures print one line
naming the error code and what to do, and exit 1.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from typing import Any
from urllib.parse import quote

from api.cli_support import CliError, ExamplesFormatter, client_security, get_json
from api.table import format_table



def add_topic_argument(parser: argparse.ArgumentParser, dest: str, *, many: bool = False,
                       required: bool = True) -> None:
    """The topic as a positional argument, or as Kafka's tools spell it,
    ``--topic NAME``; ``resolve_topic_arguments`` merges the two after
    parsing."""
    if many:
        parser.add_argument(dest, nargs="*", metavar="NAME", default=[], help="topic names")
        parser.add_argument("--topic", action="append", default=[], dest=f"{dest}_flag",
                            metavar="NAME", help="a topic, as Kafka's tools name it "
                                                 "(repeatable; the same as NAME)")
    else:
        parser.add_argument(dest, nargs="?", metavar="TOPIC", help="the topic's name")
        parser.add_argument("--topic", dest=f"{dest}_flag", metavar="TOPIC",
                            help="the topic, as Kafka's tools name it (the same as TOPIC)")
    parser.set_defaults(topic_argument=(dest, many, required))


def resolve_topic_arguments(args: argparse.Namespace) -> None:
    """Fold ``--topic`` into the positional topic argument of the command
    that has one; raise ``CliError`` when neither or two different are given."""
    spec = getattr(args, "topic_argument", None)
    if spec is None:
        return
    dest, many, required = spec
    positional, flag = getattr(args, dest), getattr(args, f"{dest}_flag")
    if many:
        names = list(positional) + [n for n in flag if n not in positional]
        if required and not names:
            raise CliError("name at least one topic (NAME or --topic NAME)")
        setattr(args, dest, names)
        return
    if positional is not None and flag is not None and positional != flag:
        raise CliError(f"two topics given: {positional!r} and --topic {flag!r}; give one")
    topic = positional if positional is not None else flag
    if required and topic is None:
        raise CliError("name the topic (TOPIC or --topic TOPIC)")
    setattr(args, dest, topic)

def add_commands(commands: argparse._SubParsersAction) -> None:
    _add_topics(commands)
    _add_partitions(commands)
    _add_produce(commands)
    _add_consume(commands)


# -- topics ----------------------------------------------------------------------------
def _add_topics(commands: argparse._SubParsersAction) -> None:
    topics = commands.add_parser(
        "topics", help="create, list, describe, alter and delete topics",
        description="Manage topics, like kafka-topics. Examples:\n"
                    "  kraftlog topics create orders --partitions 6\n"
                    "  kraftlog topics describe orders\n"
                    "  kraftlog topics alter orders --partitions 12 --config retention.ms=86400000",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = topics.add_subparsers(dest="topics_command", metavar="ACTION")
    actions.required = True

    create = actions.add_parser(
        "create", help="create a topic",
        description="Create a topic. Partitions and replication factor default to the "
                    "cluster's num.partitions and default.replication.factor.")
    add_topic_argument(create, "name")
    create.add_argument("--partitions", type=int, default=-1, metavar="N",
                        help="partition count (default: the cluster's num.partitions)")
    create.add_argument("--replication-factor", type=int, default=-1, metavar="R",
                        help="copies of each partition (default: the cluster's "
                             "default.replication.factor)")
    create.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                        help="topic config, e.g. retention.ms=86400000 (repeatable)")
    create.add_argument("--if-not-exists", action="store_true",
                        help="succeed quietly when the topic exists")
    create.set_defaults(handler=_topics_create)

    listing = actions.add_parser("list", help="list topics with partition counts")
    listing.add_argument("--include", metavar="REGEX",
                         help="only topics whose whole name matches REGEX, e.g. 'orders.*'")
    listing.add_argument("--exclude-internal", action="store_true",
                         help="leave out internal topics (__consumer_offsets and others "
                              "starting with __)")
    listing.set_defaults(handler=_topics_list)

    describe = actions.add_parser(
        "describe", help="partitions with leader, epoch, replicas, ISR and offsets",
        description="For each partition: leader, leader epoch, replicas, in-sync replicas, "
                    "log start offset, high watermark, log end offset and size. Without a "
                    "name, every topic. With --producers, the idempotent producers each "
                    "partition's leader remembers instead (kafka-transactions.sh "
                    "describe-producers).")
    add_topic_argument(describe, "names", many=True, required=False)
    describe.add_argument("--producers", action="store_true",
                          help="list each partition's producers: id, epoch, last sequence, "
                               "last offset and when it last wrote")
    describe.set_defaults(handler=_topics_describe)

    alter = actions.add_parser(
        "alter", help="add partitions, move them to other brokers, or change topic configs",
        description="Add partitions (never fewer: keyed records would move), move partitions "
                    "to other brokers, or set and delete topic configs. Examples:\n"
                    "  kraftlog topics alter orders --partitions 12\n"
                    "  kraftlog topics alter orders --replicas 1:2:3,2:3:1\n"
                    "  kraftlog topics alter orders --config retention.ms=86400000",
        formatter_class=ExamplesFormatter)
    add_topic_argument(alter, "name")
    alter.add_argument("--partitions", type=int, metavar="N", help="new total partition count")
    alter.add_argument("--replicas", metavar="ASSIGNMENT",
                       help="reassign partitions, as Kafka's --replica-assignment: partitions "
                            "separated by ',' (partition 0 first), each one's broker ids by "
                            "':', the first its preferred leader, e.g. 1:2:3,2:3:1")
    alter.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                       help="set a topic config (repeatable)")
    alter.add_argument("--delete-config", action="append", default=[], metavar="KEY",
                       help="remove a topic config override (repeatable)")
    alter.set_defaults(handler=_topics_alter)

    delete = actions.add_parser("delete", help="delete topics and their data")
    add_topic_argument(delete, "names", many=True)
    delete.set_defaults(handler=_topics_delete)


def _admin(args: argparse.Namespace):
    from api.client import Admin

    return Admin(bootstrap=args.bootstrap, **client_security())


def _fail(what: str, exc: Exception) -> None:
    code = getattr(exc, "code", None)
    raise CliError(f"{what}: {code + ': ' if code else ''}{getattr(exc, 'message', exc)}")


def _parse_configs(pairs: list[str]) -> dict[str, str]:
    configs = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CliError(f"--config takes KEY=VALUE, got {pair!r}")
        configs[key.strip()] = value.strip()
    return configs


def _topics_create(args: argparse.Namespace) -> int:
    from api.client import KraftlogError, NewTopic

    topic = NewTopic(args.name, num_partitions=args.partitions,
                     replication_factor=args.replication_factor,
                     configs=_parse_configs(args.config))
    with _admin(args) as admin:
        try:
            admin.create_topics([topic])
        except KraftlogError as exc:
            if args.if_not_exists and exc.code == "TOPIC_ALREADY_EXISTS":
                return 0
            _fail(f"cannot create topic {args.name!r}", exc)
    print(f"Created topic {args.name}.")
    return 0


def _topics_list(args: argparse.Namespace) -> int:
    try:
        include = re.compile(args.include) if args.include else None
    except re.error as exc:
        raise CliError(f"--include {args.include!r} is not a regular expression: {exc}") \
            from None
    answer = inspect_json(args, "/v1/topics")
    rows = [(t["name"], str(t["partitions"]), str(t["replication_factor"]))
            for t in answer["topics"]
            if (include is None or include.fullmatch(t["name"]))
            and not (args.exclude_internal and t["name"].startswith("__"))]
    if not rows:
        print("No topics. Create one: kraftlog topics create NAME --partitions 3")
        return 0
    print(format_table(("TOPIC", "PARTITIONS", "REPLICATION"), rows))
    return 0


def _topics_describe(args: argparse.Namespace) -> int:
    names = args.names or [t["name"] for t in inspect_json(args, "/v1/topics")["topics"]]
    blocks = []
    if args.producers:
        return _describe_producers(args, names)
    for name in names:
        topic = inspect_json(args, "/v1/topics/" + quote(name, safe=""))
        configs = ",".join(f"{k}={v}" for k, v in sorted(topic.get("configs", {}).items()))
        replication = max((len(p["replicas"]) for p in topic["partitions"]), default=0)
        header = (f"Topic: {name}\tTopicId: {topic['topic_id']}\t"
                  f"PartitionCount: {len(topic['partitions'])}\t"
                  f"ReplicationFactor: {replication}\tConfigs: {configs or '-'}")
        # Compacted (by its own config or the cluster default): the leader
        # reports its cleaner's figures.
        compacted = any(p.get("cleaner") is not None for p in topic["partitions"])
        # Eligible leader replicas (KIP-966), when a partition has any.
        eligible = any(p.get("elr") or p.get("last_known_leader", -1) != -1
                       for p in topic["partitions"])
        rows = [(str(p["partition"]), _or_none(p["leader"]), str(p["leader_epoch"]),
                 _ids(p["replicas"]), _ids(p["isr"]))
                + ((_ids(p.get("elr", [])), _or_none(p.get("last_known_leader", -1)))
                   if eligible else ())
                + (_or_dash(p.get("log_start_offset")), _or_dash(p.get("last_stable_offset")),
                   _or_dash(p.get("high_watermark")), _or_dash(p.get("log_end_offset")),
                   _size(p.get("size_bytes"))) + (_cleaner_columns(p) if compacted else ())
                for p in topic["partitions"]]
        blocks.append(header + "\n" + format_table(
            ("PARTITION", "LEADER", "EPOCH", "REPLICAS", "ISR")
            + (("ELR", "LAST-LEADER") if eligible else ())
            + ("LOG-START", "LSO", "HIGH-WATERMARK", "LOG-END", "SIZE")
            + (("CLEANABLE", "LAST-CLEAN") if compacted else ()), rows))
    print("\n\n".join(blocks) if blocks else "No topics.")
    return 0


def _cleaner_columns(partition: dict) -> tuple[str, str]:
    """A compacted partition's leader: the share of its log not compacted
    yet (what min.cleanable.dirty.ratio is compared with), and when it was
    last compacted."""
    found = partition.get("cleaner")
    if not found:
        return "-", "-"
    last = found.get("last_clean_ms")
    return (f"{100 * found['cleanable_ratio']:.0f}%",
            _timestamp(last) if last is not None else "never")


def _describe_producers(args: argparse.Namespace, names: list[str]) -> int:
    rows = []
    for name in names:
        topic = inspect_json(args, "/v1/topics/" + quote(name, safe="") + "?producers=true")
        for p in topic["partitions"]:
            producers = p.get("producers")
            if producers is None:
                rows.append((name, str(p["partition"]), "?", "-", "-", "-",
                             "leader unavailable"))
                continue
            for producer in producers:
                rows.append((name, str(p["partition"]), str(producer["producer_id"]),
                             str(producer["producer_epoch"]), str(producer["last_sequence"]),
                             str(producer["last_offset"]),
                             _timestamp(producer["last_timestamp"])))
    if not rows:
        print("No idempotent producers have written to "
              f"{', '.join(names) if names else 'any topic'}.")
        return 0
    print(format_table(("TOPIC", "PARTITION", "PRODUCER-ID", "EPOCH", "LAST-SEQUENCE",
                        "LAST-OFFSET", "LAST-WRITE"), rows))
    return 0


def _timestamp(ms: int) -> str:
    if ms is None or ms < 0:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


def _or_none(leader: int) -> str:
    return "none" if leader is None or leader < 0 else str(leader)


def _or_dash(value: Any) -> str:
    return "-" if value is None else str(value)


def _size(size: int | None) -> str:
    if size is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(size)


def _topics_alter(args: argparse.Namespace) -> int:
    from api.client import KraftlogError

    if (args.partitions is None and args.replicas is None and not args.config
            and not args.delete_config):
        raise CliError("nothing to alter: give --partitions, --replicas, --config or "
                       "--delete-config")
    if args.partitions is not None and args.replicas is not None:
        raise CliError("--replicas moves existing partitions; add partitions with "
                       "--partitions in a separate call")
    plan = None
    if args.replicas is not None:
        plan = {(args.name, partition): replicas for partition, replicas in
                enumerate(_parse_replica_assignment(args.replicas))}
    with _admin(args) as admin:
        try:
            if args.partitions is not None:
                admin.create_partitions({args.name: args.partitions})
                print(f"Topic {args.name} now has {args.partitions} partitions.")
            if plan is not None:
                _report_reassignments(
                    plan, admin.alter_partition_reassignments(plan, raise_on_error=False))
            changes: dict[str, str | None] = dict(_parse_configs(args.config))
            changes.update({key: None for key in args.delete_config})
            if changes:
                admin.alter_configs(args.name, changes)
                print(f"Updated configs of topic {args.name}: "
                      + ", ".join(f"{k}={'(default)' if v is None else v}"
                                  for k, v in changes.items()))
        except KraftlogError as exc:
            _fail(f"cannot alter topic {args.name!r}", exc)
    return 0


def _parse_replica_assignment(text: str) -> list[list[int]]:
    """Kafka's --replica-assignment: ``1:2:3,2:3:1`` -> [[1, 2, 3], [2, 3, 1]]."""
    assignment = []
    for partition in text.split(","):
        try:
            replicas = [int(broker) for broker in partition.split(":")]
        except ValueError:
            replicas = []
        if not replicas or min(replicas) < 0:
            raise CliError(f"--replicas takes broker ids like 1:2:3,2:3:1 (partitions separated "
                           f"by ',', partition 0 first; brokers by ':'), got {text!r}")
        assignment.append(replicas)
    return assignment


def _topics_delete(args: argparse.Namespace) -> int:
    from api.client import KraftlogError

    with _admin(args) as admin:
        try:
            admin.delete_topics(args.names)
        except KraftlogError as exc:
            _fail("cannot delete", exc)
    for name in args.names:
        print(f"Deleted topic {name}.")
    return 0


#: Answers that mean "ask again shortly" (a group's coordinator being
#: created or loading), and how long the CLI keeps asking.
INSPECT_RETRY_CODES = frozenset({"COORDINATOR_NOT_AVAILABLE", "COORDINATOR_LOAD_IN_PROGRESS"})
INSPECT_RETRY_S = 10.0


def inspect_json(args: argparse.Namespace, path: str) -> dict:
    """GET an inspection endpoint; its error as one line (``CODE: message``)."""
    import time

    deadline = time.monotonic() + INSPECT_RETRY_S
    while True:
        answer = get_json(args.bootstrap.rstrip("/") + path)
        if not (isinstance(answer, dict) and "error" in answer):
            return answer
        error = answer["error"]
        if error.get("code") not in INSPECT_RETRY_CODES or time.monotonic() > deadline:
            raise CliError(f"{error.get('code')}: {error.get('message')}")
        time.sleep(0.1)


# -- partitions ------------------------------------------------------------------------
def _add_partitions(commands: argparse._SubParsersAction) -> None:
    examples = ExamplesFormatter
    partitions = commands.add_parser(
        "partitions", help="move partitions between brokers; elect preferred leaders",
        description="Move partitions to other brokers, like kafka-reassign-partitions, and "
                    "move leadership back to preferred replicas, like kafka-leader-election. "
                    "Examples:\n"
                    "  kraftlog partitions reassign --topic orders --partition 0 --replicas 2,3\n"
                    "  kraftlog partitions reassign --reassignment-json-file plan.json\n"
                    "  kraftlog partitions reassignments\n"
                    "  kraftlog partitions reassign --cancel --topic orders --partition 0\n"
                    "  kraftlog partitions elect-leaders --topic orders",
        formatter_class=examples)
    actions = partitions.add_subparsers(dest="partitions_command", metavar="ACTION")
    actions.required = True

    reassign = actions.add_parser(
        "reassign", help="move partitions to new replicas, or cancel a move",
        description="Give partitions new replicas (the first is the preferred leader). The "
                    "new replicas copy the log from the leader; once every one is in sync the "
                    "old ones are dropped, and if the leader is not among the new replicas "
                    "the first in-sync new one takes over. Name one partition with --topic, "
                    "--partition and --replicas, or many in a JSON plan in Kafka's format:\n"
                    '  {"version": 1, "partitions": [\n'
                    '    {"topic": "orders", "partition": 0, "replicas": [2, 3]}]}\n'
                    "--cancel stops the reassignment under way of the named partitions "
                    "(replicas in a plan are then ignored) and goes back to their original "
                    "replicas. A new target for a partition already moving replaces the old "
                    "one.",
        formatter_class=examples)
    reassign.add_argument("--topic", metavar="TOPIC", help="the partition's topic")
    reassign.add_argument("--partition", type=int, metavar="P", help="the partition's number")
    reassign.add_argument("--replicas", metavar="IDS",
                          help="the new replicas as comma-separated broker ids, e.g. 2,3,1")
    reassign.add_argument("--reassignment-json-file", metavar="FILE",
                          help="reassign every partition of this JSON plan (Kafka's format)")
    reassign.add_argument("--cancel", action="store_true",
                          help="cancel the reassignment under way instead")
    reassign.set_defaults(handler=_partitions_reassign)

    listing = actions.add_parser(
        "reassignments", help="list the reassignments in progress",
        description="Partitions being reassigned: all their replicas now (the new ones "
                    "first), those being added (still copying the log) and those removed once "
                    "the new ones are in sync.")
    listing.add_argument("--topic", metavar="TOPIC", help="only this topic's partitions")
    listing.set_defaults(handler=_partitions_reassignments)

    elect = actions.add_parser(
        "elect-leaders", help="move leadership back to the preferred replicas, or "
                              "(--unclean) give offline partitions a leader",
        description="Preferred leader election, like kafka-leader-election --election-type "
                    "PREFERRED: a partition whose first replica is live and in sync but does "
                    "not lead gets it as leader. With --unclean, like --election-type "
                    "UNCLEAN: a partition with NO leader gets one, from outside its ISR when "
                    "no ISR member is live, whatever unclean.leader.election.enable says. "
                    "That accepts data loss: what the old ISR held past the new leader's log "
                    "end is gone (returning members truncate to the new leader), and the "
                    "command prints that offset per partition; partitions that have a leader "
                    "are left alone. Every partition without --topic.",
        formatter_class=examples)
    elect.add_argument("--topic", metavar="TOPIC", help="only this topic's partitions")
    elect.add_argument("--partition", type=int, metavar="P",
                       help="only this partition (needs --topic)")
    elect.add_argument("--unclean", action="store_true",
                       help="elect leaders of partitions that have none, from outside the "
                            "ISR if need be (accepts data loss)")
    elect.set_defaults(handler=_partitions_elect_leaders)


def _partitions_reassign(args: argparse.Namespace) -> int:
    from api.client import KraftlogError

    plan = _reassignment_request(args)
    with _admin(args) as admin:
        try:
            results = admin.alter_partition_reassignments(plan, raise_on_error=False)
        except KraftlogError as exc:
            _fail("cannot reassign", exc)
    _report_reassignments(plan, results)
    return 0


def _reassignment_request(args: argparse.Namespace) -> dict[tuple[str, int], list[int] | None]:
    """(topic, partition) -> new replicas (None: cancel), from the flags."""
    if args.reassignment_json_file is not None:
        if args.topic is not None or args.partition is not None or args.replicas is not None:
            raise CliError("--reassignment-json-file names the partitions itself; leave out "
                           "--topic, --partition and --replicas")
        plan = _load_reassignment_plan(args.reassignment_json_file, args.cancel)
        return {tp: None if args.cancel else replicas for tp, replicas in plan.items()}
    if args.topic is None or args.partition is None:
        raise CliError("name the partition: --topic T --partition P (or give "
                       "--reassignment-json-file FILE)")
    if args.cancel:
        if args.replicas is not None:
            raise CliError("--cancel goes back to the original replicas; leave out --replicas")
        return {(args.topic, args.partition): None}
    if args.replicas is None:
        raise CliError("give the new replicas: --replicas 1,2,3 (or --cancel)")
    try:
        replicas = [int(broker) for broker in args.replicas.split(",")]
    except ValueError:
        replicas = []
    if not replicas or min(replicas) < 0:
        raise CliError(f"--replicas takes comma-separated broker ids like 1,2,3, "
                       f"got {args.replicas!r}")
    return {(args.topic, args.partition): replicas}


def _load_reassignment_plan(path: str, cancel: bool) -> dict[tuple[str, int], list[int]]:
    """Kafka's reassignment JSON: ``{"version": 1, "partitions": [{"topic",
    "partition", "replicas"}]}`` (``log_dirs`` and other keys ignored).
    ``replicas`` may be left out of a plan used to cancel."""
    try:
        with open(path, encoding="utf-8") as f:
            plan = json.load(f)
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise CliError(f"{path} is not valid JSON: {exc}") from None
    shape = ('{"version": 1, "partitions": [{"topic": "t", "partition": 0, '
             '"replicas": [1, 2]}]}')
    entries = plan.get("partitions") if isinstance(plan, dict) else None
    if not isinstance(entries, list) or not entries or plan.get("version", 1) != 1:
        raise CliError(f"{path} must hold a plan like {shape}")
    partitions: dict[tuple[str, int], list[int]] = {}
    for i, entry in enumerate(entries):
        where = f"{path}: partitions[{i}]"
        if not isinstance(entry, dict):
            raise CliError(f"{where} must be a map like {shape}")
        topic, partition = entry.get("topic"), entry.get("partition")
        replicas = entry.get("replicas", [] if cancel else None)
        if not isinstance(topic, str) or not _is_id(partition):
            raise CliError(f"{where} needs a topic name and a partition number")
        if not isinstance(replicas, list) or not all(_is_id(b) for b in replicas):
            raise CliError(f"{where} needs replicas as a list of broker ids")
        if (topic, partition) in partitions:
            raise CliError(f"{where} names {topic}-{partition} a second time")
        partitions[(topic, partition)] = replicas
    return partitions


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _report_reassignments(plan: dict, results: dict) -> None:
    """One line per partition reassigned (or cancelled); the first failure,
    if any, as the command's error."""
    failed = []
    for tp, error in results.items():
        replicas = plan.get((tp.topic, tp.partition))
        if error is not None:
            failed.append((tp, error, replicas))
        elif replicas is None:
            print(f"Cancelled the reassignment of {tp.topic}-{tp.partition}.")
        else:
            print(f"Reassigning {tp.topic}-{tp.partition} to replicas "
                  f"{','.join(map(str, replicas))}.")
    if failed:
        tp, error, replicas = failed[0]
        doing = "cancel the reassignment of" if replicas is None else "reassign"
        more = f" ({len(failed)} of {len(results)} partitions failed)" if len(failed) > 1 else ""
        raise CliError(f"cannot {doing} {tp.topic}-{tp.partition}: {error.code}: "
                       f"{error.message}{more}")


def _partitions_reassignments(args: argparse.Namespace) -> int:
    from api.client import KraftlogError

    with _admin(args) as admin:
        try:
            found = admin.list_partition_reassignments(
                None if args.topic is None else [args.topic])
        except KraftlogError as exc:
            _fail("cannot list reassignments", exc)
    if not found:
        print("No reassignments in progress.")
        return 0
    rows = [(tp.topic, str(tp.partition), _ids(r.replicas), _ids(r.adding_replicas),
             _ids(r.removing_replicas)) for tp, r in sorted(found.items())]
    print(format_table(("TOPIC", "PARTITION", "REPLICAS", "ADDING", "REMOVING"), rows))
    return 0


def _ids(broker_ids: list[int]) -> str:
    return ",".join(map(str, broker_ids)) or "-"


def _partitions_elect_leaders(args: argparse.Namespace) -> int:
    from api.client import KraftlogError, TopicPartition

    if args.partition is not None and args.topic is None:
        raise CliError("--partition needs --topic")
    with _admin(args) as admin:
        try:
            topics = admin.describe_topics(None if args.topic is None else [args.topic])
            before = {TopicPartition(name, p.partition): p
                      for name, topic in topics.items() for p in topic.partitions}
            wanted = None
            if args.partition is not None:
                wanted = [TopicPartition(args.topic, args.partition)]
            elif args.topic is not None:
                wanted = sorted(before)
            results = admin.elect_leaders(
                wanted, election_type="unclean" if args.unclean else "preferred")
            if args.unclean:
                after = admin.describe_topics(sorted({tp.topic for tp in results})) \
                    if results else {}
        except KraftlogError as exc:
            _fail("cannot elect leaders", exc)
    if args.unclean:
        return _report_unclean(args, results, before, after)
    # An answer without error means the preferred (first) replica leads now.
    moved = [(tp, before[tp]) for tp, error in sorted(results.items())
             if error is None and tp in before and before[tp].replicas
             and before[tp].leader != before[tp].replicas[0]]
    failed = [(tp, error) for tp, error in sorted(results.items()) if error is not None]
    if moved:
        print(format_table(("TOPIC", "PARTITION", "LEADER", "PREVIOUS-LEADER"), [
            (tp.topic, str(tp.partition), str(info.replicas[0]), _or_none(info.leader))
            for tp, info in moved]))
    elif not failed:
        print("No leader election needed: every partition is led by its preferred replica.")
    _raise_first_failure(failed, "the preferred leader")
    return 0


def _raise_first_failure(failed: list, what: str) -> None:
    """An election's failed partitions, as one line naming the first."""
    if failed:
        tp, error = failed[0]
        more = f" ({len(failed)} partitions failed)" if len(failed) > 1 else ""
        raise CliError(f"cannot elect {what} of {tp.topic}-{tp.partition}: "
                       f"{error.code}: {error.message}{more}")


def _report_unclean(args: argparse.Namespace, results: dict, before: dict, after: dict) -> int:
    """The partitions an unclean election gave a leader, and what it cost."""
    from api.client import Consumer, KraftlogError, TopicPartition

    now = {TopicPartition(name, p.partition): p for name, topic in after.items()
           for p in topic.partitions}
    elected = sorted(tp for tp, error in results.items() if error is None and tp in now)
    failed = [(tp, error) for tp, error in sorted(results.items())
              if error is not None and error.code != "ELECTION_NOT_NEEDED"]
    ends: dict = {}
    if elected:
        try:
            with Consumer(args.bootstrap, request_timeout_ms=10_000,
                          **client_security()) as consumer:
                ends = consumer.end_offsets(elected)
        except KraftlogError:
            pass  # the table says "-"
    if elected:
        def clean(tp: Any) -> bool:  # led by a member of the old ISR or ELR
            return tp in before and now[tp].leader in (*before[tp].isr, *before[tp].elr)

        print(format_table(("TOPIC", "PARTITION", "LEADER", "OLD-ISR", "OLD-ELR", "CLEAN",
                            "LOG-END"), [
            (tp.topic, str(tp.partition), str(now[tp].leader),
             _ids(before[tp].isr) if tp in before else "-",
             _ids(list(before[tp].elr)) if tp in before else "-",
             "yes" if clean(tp) else "NO",
             str(ends[tp]) if tp in ends else "-") for tp in elected]))
        unclean = [tp for tp in elected if not clean(tp)]
        if unclean:
            print(f"warning: {len(unclean)} partitions are led from outside their ISR and "
                  "eligible leader replicas: records those held from LOG-END on are lost, "
                  "and returning members truncate to the new leader")
    elif not failed:
        print("No leader election needed: every partition has a leader.")
    _raise_first_failure(failed, "a leader")
    return 0


# -- produce ------------------------------------------------------------------------------
def _add_produce(commands: argparse._SubParsersAction) -> None:
    produce = commands.add_parser(
        "produce", help="send lines from stdin as records",
        description="Read stdin and send each line as one record, like "
                    "kafka-console-producer. With --null-value each line names a key "
                    "to delete from a compacted topic instead (a tombstone: the key "
                    "with a null value). Examples:\n"
                    "  echo hello | kraftlog produce orders\n"
                    "  printf 'user-1:{\"total\":42}\\n' | kraftlog produce orders "
                    "--key-separator :\n"
                    "  printf 'user-1\\nuser-2\\n' | kraftlog produce orders --null-value",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_topic_argument(produce, "topic")
    produce.add_argument("--key-separator", metavar="SEP",
                         help="split each line at the first SEP into key and value "
                              "(lines without it are keyless)")
    produce.add_argument("--null-value", action="store_true",
                         help="send every record with a null value (a tombstone: on a "
                              "compacted topic it deletes its key). Each line is then a key: "
                              "the whole line, or with --key-separator the text before the "
                              "first SEP (the rest of the line is ignored; a line without "
                              "SEP is all key)")
    produce.add_argument("--acks", default="all", choices=["0", "1", "all", "-1"],
                         help="acknowledgement the producer waits for (default all)")
    produce.add_argument("--partition", type=int, metavar="P",
                         help="send every record to this partition (default: by key, "
                              "or sticky for keyless records)")
    produce.add_argument("--linger-ms", type=int, default=5, metavar="MS",
                         help="wait up to this long to fill a batch (default %(default)s)")
    produce.add_argument("--delivery-timeout-ms", type=int, default=30_000, metavar="MS",
                         help="give up on a record after this long (default %(default)s)")
    produce.set_defaults(handler=_produce)


def _produce(args: argparse.Namespace) -> int:
    from api.client import Consumer, KraftlogError, Producer

    # A broker that cannot be reached fails now, as `consume` and `topics`
    # do, instead of every record failing after delivery_timeout_ms as if
    # the topic were missing. (A missing topic still waits: it may be
    # created meanwhile, as Kafka's producer waits for its metadata.)
    with Consumer(args.bootstrap, request_timeout_ms=5000, **client_security()) as probe:
        try:
            probe.partitions_for_topic(args.topic)
        except KraftlogError as exc:
            if exc.code == "BROKER_NOT_AVAILABLE":
                _fail(f"cannot write to topic {args.topic!r}", exc)
    acks = -1 if args.acks in ("all", "-1") else int(args.acks)
    failures: list[str] = []  # the first failed record's error, then a count
    failed = 0
    sent = 0

    def on_delivery(error, _metadata) -> None:
        nonlocal failed
        if error is not None:
            failed += 1
            if not failures:
                failures.append(f"{error.code}: {error.message}")

    try:
        producer = Producer(bootstrap=args.bootstrap, **client_security(), acks=acks,
                            linger_ms=args.linger_ms,
                            request_timeout_ms=min(30_000, args.delivery_timeout_ms // 2),
                            delivery_timeout_ms=args.delivery_timeout_ms)
    except KraftlogError as exc:
        _fail("cannot start the producer", exc)
    try:
        for line in sys.stdin.buffer:
            line = line.rstrip(b"\r\n")
            key, value = _split_line(line, args)
            producer.send(args.topic, value, key=key, partition=args.partition,
                          on_delivery=on_delivery)
            sent += 1
        producer.flush()
    except KeyboardInterrupt:
        producer.flush()
    finally:
        producer.close()
    if failures:
        raise CliError(f"{failed} of {sent} records failed, e.g. {failures[0]}")
    print(f"Produced {sent} record{'' if sent == 1 else 's'} to {args.topic}.")
    return 0


def _split_line(line: bytes, args: argparse.Namespace) -> tuple[bytes | None, bytes | None]:
    """One input line as ``(key, value)``. Normally the line is the value,
    and the text before the first separator, if any, the key. With
    ``--null-value`` the value is null and the line names the key: a
    tombstone without a key would delete nothing."""
    sep = args.key_separator.encode() if args.key_separator else None
    if args.null_value:
        return (line.split(sep, 1)[0] if sep else line), None
    if sep and sep in line:
        key, value = line.split(sep, 1)
        return key, value
    return None, line


# -- consume ------------------------------------------------------------------------------
def _add_consume(commands: argparse._SubParsersAction) -> None:
    consume = commands.add_parser(
        "consume", help="print records of a topic",
        description="Print records as they arrive, like kafka-console-consumer. Starts at "
                    "the end of each partition unless told otherwise. Examples:\n"
                    "  kraftlog consume orders --from-beginning --max-messages 10\n"
                    "  kraftlog consume orders --partition 2 --offset 100 --print-offset\n"
                    "  kraftlog consume orders --group billing   # share the partitions, "
                    "commit offsets",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_topic_argument(consume, "topic")
    consume.add_argument("--from-beginning", action="store_true",
                         help="start at the earliest offset of each partition")
    consume.add_argument("--partition", type=int, metavar="P", help="read only this partition")
    consume.add_argument("--offset", metavar="OFFSET",
                         help="start here (a number, 'earliest' or 'latest'); "
                              "needs --partition")
    consume.add_argument("--max-messages", type=int, metavar="N", help="stop after N records")
    consume.add_argument("--timeout-ms", type=int, metavar="MS",
                         help="stop when no record arrives for this long")
    consume.add_argument("--print-key", action="store_true", help="print KEY<TAB>VALUE")
    consume.add_argument("--null-literal", default="null", metavar="TEXT",
                         help="print a null key or value (a tombstone's) as TEXT "
                              "(default %(default)s, as Kafka's null.literal), e.g. "
                              "--null-literal '<tombstone>' to tell it from the text null")
    consume.add_argument("--print-offset", action="store_true",
                         help="prefix each record with PARTITION:OFFSET<TAB>")
    consume.add_argument("--group", metavar="GROUP",
                         help="consume as a member of this consumer group: the group assigns "
                              "the partitions and offsets are committed (a new group starts "
                              "at the end, or the beginning with --from-beginning)")
    consume.add_argument("--isolation-level", choices=("read_uncommitted", "read_committed"),
                         default="read_uncommitted",
                         help="read_committed: only records of committed transactions, up "
                              "to the last stable offset (default %(default)s)")
    consume.add_argument("--session-timeout-ms", type=int, default=45_000, metavar="MS",
                         help="with --group: how long the group waits for a silent member "
                              "before giving its partitions to others (default %(default)s)")
    consume.set_defaults(handler=_consume)


def _consume(args: argparse.Namespace) -> int:
    import time

    from api.client import Consumer, KraftlogError, TopicPartition

    if args.offset is not None and args.partition is None:
        raise CliError("--offset needs --partition (an offset belongs to one partition)")
    if args.group is not None and (args.partition is not None or args.offset is not None):
        raise CliError("--group lets the group choose partitions and offsets: drop "
                       "--partition and --offset, or drop --group")
    reset = "earliest" if args.from_beginning else "latest"
    # With --group, offsets are committed only for records already printed
    # (after each batch, and at exit), never for ones a Ctrl-C cut off.
    consumer = Consumer(bootstrap=args.bootstrap, **client_security(),
                        auto_offset_reset=reset,
                        isolation_level=args.isolation_level,
                        **({"group_id": args.group, "session_timeout_ms":
                            args.session_timeout_ms, "enable_auto_commit": False}
                           if args.group else {}))
    printed_up_to: dict = {}
    printed = 0
    out = sys.stdout.buffer
    try:
        try:
            partitions = sorted(consumer.partitions_for_topic(args.topic) or ())
        except KraftlogError as exc:
            _fail(f"cannot read topic {args.topic!r}", exc)
        if not partitions:
            raise CliError(f"topic {args.topic!r} does not exist")
        if args.partition is not None:
            if args.partition not in partitions:
                raise CliError(f"topic {args.topic!r} has partitions 0 to "
                               f"{partitions[-1]}, not {args.partition}")
            partitions = [args.partition]
        tps = [TopicPartition(args.topic, p) for p in partitions]
        if args.group is not None:
            consumer.subscribe([args.topic])
        else:
            consumer.assign(tps)
            _position(consumer, tps, args)
        last_record = time.monotonic()
        while args.max_messages is None or printed < args.max_messages:
            # Never take more than will be printed: with --group, what poll
            # returned counts as consumed at the next commit.
            records = consumer.poll(timeout_ms=200, max_records=None if args.max_messages is None
                                    else args.max_messages - printed)
            if not records:
                if args.timeout_ms is not None and \
                        (time.monotonic() - last_record) * 1000 >= args.timeout_ms:
                    break
                continue
            last_record = time.monotonic()
            for record in records:
                if args.max_messages is not None and printed >= args.max_messages:
                    break
                out.write(_format(record, args))
                printed += 1
                printed_up_to[TopicPartition(record.topic, record.partition)] = record.offset + 1
            out.flush()
            if args.group is not None and printed_up_to:
                consumer.commit_async(dict(printed_up_to))
    except KeyboardInterrupt:
        pass
    except KraftlogError as exc:
        _fail("consume failed", exc)
    finally:
        try:
            if args.group is not None and printed_up_to:
                consumer.commit(printed_up_to)
        except KraftlogError as exc:
            print(f"warning: the last offsets were not committed: {exc}", file=sys.stderr)
        finally:
            consumer.close()
    print(f"Processed a total of {printed} messages", file=sys.stderr)
    return 0


def _position(consumer, tps: list, args: argparse.Namespace) -> None:
    if args.offset is None:
        if args.from_beginning:
            consumer.seek_to_beginning(tps)
        else:
            consumer.seek_to_end(tps)
    elif args.offset == "earliest":
        consumer.seek_to_beginning(tps)
    elif args.offset == "latest":
        consumer.seek_to_end(tps)
    else:
        try:
            offset = int(args.offset)
        except ValueError:
            raise CliError(f"--offset takes a number, 'earliest' or 'latest', "
                           f"not {args.offset!r}") from None
        if offset < 0:
            raise CliError("--offset must not be negative")
        tp = tps[0]
        start = consumer.beginning_offsets([tp])[tp]
        end = consumer.end_offsets([tp])[tp]
        if not start <= offset <= end:
            reset = "earliest" if args.from_beginning else "latest"
            raise CliError(
                f"OFFSET_OUT_OF_RANGE: offset {offset} of {tp.topic}-{tp.partition} is outside "
                f"its range [{start}, {end}] (log start to end); give an offset in it, or "
                f"'earliest' or 'latest' (auto.offset.reset={reset} would start at "
                f"{start if reset == 'earliest' else end})")
        consumer.seek(tp, offset)


def _format(record, args: argparse.Namespace) -> bytes:
    parts = []
    if args.print_offset:
        parts.append(f"{record.partition}:{record.offset}".encode())
    null = args.null_literal.encode()
    if args.print_key:
        parts.append(null if record.key is None else record.key)
    parts.append(null if record.value is None else record.value)
    return b"\t".join(parts) + b"\n"
