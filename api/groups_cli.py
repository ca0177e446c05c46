"""``kraftlog groups list | describe | delete | reset-offsets``: consumer groups
as ``kafka-consumer-groups`` shows them."""

from __future__ import annotations

import argparse
import datetime
import sys
import urllib.parse
from typing import Any

from api.table import format_table


def add_commands(commands: argparse._SubParsersAction, formatter: type) -> None:
    groups = commands.add_parser(
        "groups", help="consumer groups: members, assignments, committed offsets, lag",
        formatter_class=formatter,
        description="Inspect and manage consumer groups (kafka-consumer-groups). Every "
                    "group lives on one broker, its coordinator; any broker finds it.",
        epilog="examples:\n"
               "  kraftlog groups list\n"
               "  kraftlog groups describe billing\n"
               "  kraftlog groups reset-offsets billing --topic orders --to-earliest\n"
               "  kraftlog groups delete billing")
    actions = groups.add_subparsers(dest="groups_command", metavar="ACTION")
    actions.required = True
    listing = actions.add_parser("list", help="every group with its state and member count")
    listing.set_defaults(handler=_list)
    describe = actions.add_parser(
        "describe", help="per partition: committed offset, log end, lag, member, host",
        description="Per partition the group consumes or has offsets for: the committed "
                    "offset, the log end offset (high watermark), the lag between them, and "
                    "the member that owns it with its host; then the members.")
    describe.add_argument("group", metavar="GROUP", help="the group id")
    describe.set_defaults(handler=_describe)
    delete = actions.add_parser("delete", help="delete an empty group and its offsets")
    delete.add_argument("group", metavar="GROUP", help="the group id")
    delete.set_defaults(handler=_delete)
    reset = actions.add_parser(
        "reset-offsets", help="move an empty group's committed offsets",
        description="Plan, and with --execute set, the committed offsets of GROUP for the "
                    "partitions of --topic (all of them, or --partition P): a table of "
                    "current -> new offsets. As kafka-consumer-groups, nothing changes "
                    "without --execute. The group must have no members (stop its consumers "
                    "first): a member would overwrite them with its next commit.")
    reset.add_argument("group", metavar="GROUP", help="the group id")
    reset.add_argument("--topic", required=True, help="the topic whose offsets move")
    run = reset.add_mutually_exclusive_group()
    run.add_argument("--execute", action="store_true", help="apply the plan")
    run.add_argument("--dry-run", action="store_true",
                     help="only show the plan (the default without --execute)")
    reset.add_argument("--partition", type=int, action="append", dest="partitions",
                       help="only this partition (repeatable)")
    to = reset.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-earliest", action="store_true", help="the log start offset")
    to.add_argument("--to-latest", action="store_true", help="the log end offset")
    to.add_argument("--to-offset", type=int, metavar="OFFSET",
                    help="this offset (0 or more; clamped into the log)")
    to.add_argument("--to-datetime", metavar="ISO8601",
                    help="the first record at or after this time, e.g. 2026-11-21T10:00:00Z")
    to.add_argument("--shift-by", type=int, metavar="N",
                    help="the committed offset plus N (negative: back)")
    reset.set_defaults(handler=_reset)


def _get(args: argparse.Namespace, path: str) -> dict:
    from api.console import inspect_json

    return inspect_json(args, path)


def _list(args: argparse.Namespace) -> int:
    answer = _get(args, "/v1/groups")
    rows = [(g["group_id"], g["state"], str(g["members"]), str(g["group_epoch"]),
             str(g.get("coordinator_id", "-"))) for g in answer["groups"]]
    for missing in answer.get("unreachable_brokers") or ():
        print(f"warning: broker {missing['broker_id']} did not answer: {missing['error']}")
    if not rows:
        print("No groups. Consumers with a group_id create one when they subscribe.")
        return 0
    print(format_table(("GROUP", "STATE", "MEMBERS", "EPOCH", "COORDINATOR"), rows))
    return 0


def _describe(args: argparse.Namespace) -> int:
    from api.cli_support import CliError

    group = _get(args, "/v1/groups?group_id=" + urllib.parse.quote(args.group, safe=""))
    if group["state"] == "dead" and not group["members"] and not group["offsets"]:
        raise CliError(f"GROUP_ID_NOT_FOUND: group {args.group!r} does not exist (kraftlog "
                       "groups list shows the groups there are)")
    owners: dict[tuple[str, int], dict] = {}
    for member in group["members"]:
        for topic, partition in member["assigned"] + member["pending_revocation"]:
            owners[(topic, partition)] = member
    committed = {(o["topic"], o["partition"]): o["offset"] for o in group["offsets"]}
    partitions = sorted(set(owners) | set(committed))
    ends = _end_offsets(args, partitions)
    rows = []
    for tp in partitions:
        member = owners.get(tp)
        offset = committed.get(tp)
        end = ends.get(tp)
        lag = "-" if offset is None or end is None else str(max(0, end - offset))
        rows.append((tp[0], str(tp[1]), "-" if offset is None else str(offset),
                     "-" if end is None else str(end), lag,
                     member["member_id"][:12] if member else "-",
                     (member.get("client_host") or "-") if member else "-"))
    print(f"Group {group['group_id']}: {group['state']}, epoch {group['group_epoch']}, "
          f"assignor {group['assignor'] or '-'}, {len(group['members'])} members")
    if rows:
        print(format_table(("TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG",
                            "MEMBER", "HOST"), rows))
    if group["members"]:
        print(format_table(("MEMBER", "INSTANCE", "EPOCH", "STATE", "PARTITIONS", "HOST"), [
            (m["member_id"], m["instance_id"] or "-", str(m["member_epoch"]), m["state"],
             str(len(m["assigned"])), m.get("client_host") or "-") for m in group["members"]]))
    return 0


def _end_offsets(args: argparse.Namespace, partitions: list[tuple[str, int]]
                 ) -> dict[tuple[str, int], int]:
    if not partitions:
        return {}
    from api.cli_support import client_security
    from api.client import Consumer, KraftlogError, TopicPartition

    try:
        with Consumer(args.bootstrap, request_timeout_ms=5000, **client_security()) as consumer:
            ends = consumer.end_offsets([TopicPartition(t, p) for t, p in partitions])
    except KraftlogError:
        return {}
    return {(tp.topic, tp.partition): end for tp, end in ends.items()}


def _delete(args: argparse.Namespace) -> int:
    _admin_call(args, lambda admin: admin.delete_consumer_groups([args.group]))
    print(f"Deleted group {args.group}.")
    return 0


def _reset(args: argparse.Namespace) -> int:
    from api.cli_support import CliError, client_security
    from api.client import Consumer, KraftlogError, TopicPartition

    with Consumer(args.bootstrap, request_timeout_ms=5000, **client_security()) as consumer:
        try:
            numbers = sorted(consumer.partitions_for_topic(args.topic))
        except KraftlogError as exc:
            raise CliError(str(exc)) from None
        if args.partitions:
            unknown = sorted(set(args.partitions) - set(numbers))
            if unknown:
                raise CliError(f"{args.topic} has partitions 0 to {len(numbers) - 1}, "
                               f"not {unknown}")
            numbers = sorted(set(args.partitions))
        tps = [TopicPartition(args.topic, p) for p in numbers]
        targets = _reset_targets(args, consumer, tps)
        current = _committed(args, tps)
    if args.execute:
        _admin_call(args, lambda admin: admin.alter_consumer_group_offsets(args.group, targets))
    print(format_table(("TOPIC", "PARTITION", "CURRENT-OFFSET", "NEW-OFFSET"), [
        (tp.topic, str(tp.partition), str(current.get(tp, "-")), str(offset))
        for tp, offset in sorted(targets.items())]))
    if not args.execute:
        print("Nothing changed (a dry run): add --execute to apply this plan.", file=sys.stderr)
    return 0


def _reset_targets(args: argparse.Namespace, consumer: Any, tps: list) -> dict:
    from api.cli_support import CliError

    if args.to_offset is not None and args.to_offset < 0:
        raise CliError(f"--to-offset must be 0 or more, not {args.to_offset}; use "
                       "--to-earliest for the log start")
    starts = consumer.beginning_offsets(tps)
    ends = consumer.end_offsets(tps)
    if args.to_earliest:
        wanted = starts
    elif args.to_latest:
        wanted = ends
    elif args.to_offset is not None:
        wanted = {tp: args.to_offset for tp in tps}
    elif args.to_datetime is not None:
        try:
            moment = datetime.datetime.fromisoformat(args.to_datetime.replace("Z", "+00:00"))
        except ValueError:
            raise CliError(f"--to-datetime {args.to_datetime!r} is not an ISO 8601 time, "
                           "e.g. 2026-11-21T10:00:00Z") from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=datetime.timezone.utc)
        found = consumer.offsets_for_times({tp: int(moment.timestamp() * 1000) for tp in tps})
        wanted = {tp: (hit.offset if hit is not None else ends[tp]) for tp, hit in found.items()}
    else:
        committed = _committed(args, tps)
        wanted = {tp: committed.get(tp, starts[tp]) + args.shift_by for tp in tps}
    # Clamp into the log, as kafka-consumer-groups does.
    return {tp: min(max(offset, starts[tp]), ends[tp]) for tp, offset in wanted.items()}


def _committed(args: argparse.Namespace, tps: list) -> dict:
    from api.client import TopicPartition

    group = _get(args, "/v1/groups?group_id=" + urllib.parse.quote(args.group, safe=""))
    wanted = set(tps)
    return {TopicPartition(o["topic"], o["partition"]): o["offset"] for o in group["offsets"]
            if TopicPartition(o["topic"], o["partition"]) in wanted}


def _admin_call(args: argparse.Namespace, action) -> None:
    """Run ``action(admin)`` with an Admin on --bootstrap; errors as one line."""
    from api.cli_support import CliError, client_security
    from api.client import Admin, KraftlogError

    try:
        with Admin(args.bootstrap, request_timeout_ms=10_000, **client_security()) as admin:
            action(admin)
    except KraftlogError as exc:
        raise CliError(str(exc)) from None
