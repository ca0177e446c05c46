"""``kraftlog acls add | list | remove``: ACLs, with ``kafka-acls``'s flags
(docs/security.md). Each command is the cartesian product of its
principals, hosts, operations and resources, as ``kafka-acls`` makes it."""

from __future__ import annotations

import argparse
import itertools

from api.cli_support import admin_call, admin_client
from api.table import format_table
from protocol import acl
from protocol.errors import InvalidRequestError

_OPERATIONS = [op.lower().replace("_", "-") for op in acl.OPERATIONS]


def add_commands(commands: argparse._SubParsersAction, formatter: type) -> None:
    acls = commands.add_parser(
        "acls", help="ACLs: who may do what to which topics, groups, transactional ids and "
                     "the cluster (add, list, remove)",
        formatter_class=formatter,
        description="ACLs, Kafka's model: ALLOW or DENY a principal (User:<name>; User:* is "
                    "everyone), from a host (* any), an operation on resources named "
                    "literally (* every one) or by a prefix. A DENY wins; a resource no ACL "
                    "names is closed unless allow.everyone.if.no.acl.found; super.users "
                    "skip ACLs. Needs authorizer.class.name on every node.",
        epilog="examples:\n"
               "  kraftlog acls add --allow-principal User:etl --producer --topic orders\n"
               "  kraftlog acls add --allow-principal User:etl --consumer --topic orders "
               "--group etl\n"
               "  kraftlog acls add --allow-principal User:reporting --operation read "
               "--operation describe \\\n"
               "      --topic sales. --resource-pattern-type prefixed\n"
               "  kraftlog acls add --deny-principal User:intern --operation write --topic '*'\n"
               "  kraftlog acls list --topic orders\n"
               "  kraftlog acls remove --allow-principal User:etl --topic orders --force")
    actions = acls.add_subparsers(dest="acls_command", metavar="ACTION")
    actions.required = True
    add = actions.add_parser("add", help="create ACLs", formatter_class=formatter)
    _principal_flags(add)
    _resource_flags(add, acl.PATTERN_TYPES, acl.LITERAL)
    add.add_argument("--operation", action="append", type=_operation, metavar="OP",
                     help=f"an operation, repeatable: {', '.join(_OPERATIONS)} "
                          "(default: all)")
    add.add_argument("--producer", action="store_true",
                     help="what a producer needs: WRITE, DESCRIBE, CREATE on the topics; "
                          "with --transactional-id, WRITE and DESCRIBE on it; with "
                          "--idempotent, IDEMPOTENT_WRITE on the cluster")
    add.add_argument("--idempotent", action="store_true",
                     help="with --producer: IDEMPOTENT_WRITE on the cluster")
    add.add_argument("--consumer", action="store_true",
                     help="what a consumer needs: READ, DESCRIBE on the topics, READ on "
                          "the group (--group)")
    add.set_defaults(handler=_add)
    remove = actions.add_parser("remove", help="delete the ACLs that match",
                                formatter_class=formatter)
    _principal_flags(remove)
    _resource_flags(remove, acl.FILTER_PATTERN_TYPES, acl.LITERAL)
    remove.add_argument("--operation", action="append", type=_operation, metavar="OP",
                        help="only ACLs of these operations (default: any)")
    remove.add_argument("--force", action="store_true", help="do not ask for confirmation")
    remove.set_defaults(handler=_remove)
    listing = actions.add_parser("list", help="the ACLs, as a table",
                                 formatter_class=formatter)
    listing.add_argument("--principal", metavar="PRINCIPAL",
                         help="only ACLs of this principal")
    _resource_flags(listing, acl.FILTER_PATTERN_TYPES, acl.ANY)
    listing.set_defaults(handler=_list)


def _operation(text: str) -> str:
    name = text.strip().upper().replace("-", "_")
    if name not in acl.OPERATIONS:
        raise argparse.ArgumentTypeError(
            f"unknown operation {text!r}: one of {', '.join(_OPERATIONS)}")
    return name


def _principal_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--allow-principal", action="append", default=[], metavar="PRINCIPAL",
                        help="User:<name> (User:* for everyone) to allow, repeatable")
    parser.add_argument("--deny-principal", action="append", default=[], metavar="PRINCIPAL",
                        help="User:<name> to deny, repeatable")
    parser.add_argument("--allow-host", action="append", default=[], metavar="HOST",
                        help="IP address the allowed principals call from (default: *)")
    parser.add_argument("--deny-host", action="append", default=[], metavar="HOST",
                        help="IP address the denied principals call from (default: *)")


def _resource_flags(parser: argparse.ArgumentParser, patterns: tuple, default: str) -> None:
    parser.add_argument("--topic", action="append", default=[], metavar="TOPIC",
                        help="a topic (* for every topic), repeatable")
    parser.add_argument("--group", action="append", default=[], metavar="GROUP",
                        help="a consumer group (* for every group), repeatable")
    parser.add_argument("--transactional-id", action="append", default=[], metavar="ID",
                        help="a transactional id (* for every one), repeatable")
    parser.add_argument("--cluster", action="store_true", help="the cluster")
    parser.add_argument("--resource-pattern-type", default=default.lower(),
                        choices=[p.lower() for p in patterns],
                        help="how resource names are read (default %(default)s; match: "
                             "every ACL that applies to the name, any: every pattern type)"
                             if acl.MATCH in patterns else
                             "how resource names are read (default %(default)s)")


def _resources(args: argparse.Namespace) -> list[tuple[str, str]]:
    return ([(acl.TOPIC, t) for t in args.topic] + [(acl.GROUP, g) for g in args.group]
            + [(acl.TRANSACTIONAL_ID, x) for x in args.transactional_id]
            + ([(acl.CLUSTER, acl.CLUSTER_NAME)] if args.cluster else []))


def _entries(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """(principal, host, permission) of every principal flag."""
    out = []
    for principals, hosts, permission in ((args.allow_principal, args.allow_host, acl.ALLOW),
                                          (args.deny_principal, args.deny_host, acl.DENY)):
        out += [(p, h, permission) for p in principals for h in (hosts or [acl.WILDCARD])]
    return out


def _bindings(args: argparse.Namespace) -> list[acl.AclBinding]:
    from api.cli_support import CliError

    pattern = args.resource_pattern_type.upper()
    entries = _entries(args)
    if not entries:
        raise CliError("name who the ACLs are for: --allow-principal or --deny-principal "
                       "User:<name>")
    _check_hosts(args)
    if args.producer or args.consumer:
        if args.operation:
            raise CliError("--producer and --consumer choose the operations themselves: "
                           "drop --operation, or add those ACLs in a command of their own")
        if args.cluster and not args.idempotent:
            raise CliError("with --producer, the cluster's ACL is IDEMPOTENT_WRITE: say "
                           "--idempotent (not --cluster)")
        wanted: list[tuple[str, str, str]] = []  # (resource type, name, operation)
        if args.producer:
            wanted += [(acl.TOPIC, t, op) for t in args.topic
                       for op in (acl.WRITE, acl.DESCRIBE, acl.CREATE)]
            wanted += [(acl.TRANSACTIONAL_ID, x, op) for x in args.transactional_id
                       for op in (acl.WRITE, acl.DESCRIBE)]
            if args.idempotent:
                wanted.append((acl.CLUSTER, acl.CLUSTER_NAME, acl.IDEMPOTENT_WRITE))
        if args.consumer:
            if not args.group:
                raise CliError("--consumer needs --group GROUP (the group it reads in)")
            wanted += [(acl.TOPIC, t, op) for t in args.topic
                       for op in (acl.READ, acl.DESCRIBE)]
            wanted += [(acl.GROUP, g, acl.READ) for g in args.group]
        if not args.topic:
            raise CliError("--producer and --consumer need --topic")
    else:
        resources = _resources(args)
        if not resources:
            raise CliError("name the resources: --topic, --group, --transactional-id or "
                           "--cluster")
        wanted = [(rtype, name, op) for (rtype, name), op in itertools.product(
            resources, args.operation or [acl.ALL])]
    bindings = []
    for (principal, host, permission), (rtype, name, op) in itertools.product(entries, wanted):
        binding = acl.AclBinding(rtype, name, pattern if rtype != acl.CLUSTER else acl.LITERAL,
                                 principal, host, op, permission)
        try:
            acl.check_binding(binding)
        except InvalidRequestError as exc:  # said as the CLI says things
            raise CliError(str(exc)) from None
        bindings.append(binding)
    return sorted(set(bindings))


def _check_hosts(args: argparse.Namespace) -> None:
    from api.cli_support import CliError

    for hosts, principals, kind in ((args.allow_host, args.allow_principal, "allow"),
                                    (args.deny_host, args.deny_principal, "deny")):
        if hosts and not principals:
            raise CliError(f"--{kind}-host applies to --{kind}-principal, and none is given")


def _filters(args: argparse.Namespace) -> list[acl.AclBindingFilter]:
    from api.cli_support import CliError

    pattern = args.resource_pattern_type.upper()
    resources = _resources(args)
    if not resources and not (args.allow_principal or args.deny_principal):
        raise CliError("say which ACLs to remove: resource flags (--topic, --group, "
                       "--transactional-id, --cluster) and/or principal flags")
    _check_hosts(args)
    if not resources:
        pattern = acl.ANY  # a principal's ACLs, whatever their resources' patterns
    entries = _entries(args) or [(None, None, None)]
    operations = args.operation or [None]
    return [acl.AclBindingFilter(rtype, name, pattern, principal, host, op, permission)
            for (rtype, name), (principal, host, permission), op in itertools.product(
                resources or [(None, None)], entries, operations)]


def _table(bindings: list[acl.AclBinding]) -> str:
    return format_table(("PRINCIPAL", "HOST", "OPERATION", "PERMISSION", "RESOURCE", "NAME",
                         "PATTERN"), [
        (b.principal, b.host, b.operation, b.permission_type, b.resource_type,
         b.resource_name, b.pattern_type) for b in bindings])






def _add(args: argparse.Namespace) -> int:
    bindings = _bindings(args)
    with admin_client(args) as admin:
        admin_call(lambda: admin.create_acls(bindings))
    print(f"{len(bindings)} ACL{'s' if len(bindings) != 1 else ''} in place:")
    print(_table(bindings))
    return 0


def _remove(args: argparse.Namespace) -> int:
    from api.cli_support import CliError

    filters = _filters(args)
    with admin_client(args) as admin:
        matching = sorted({b for f in filters for b in admin_call(
            lambda f=f: admin.describe_acls(f))})
        if not matching:
            print("No ACL matches.")
            return 0
        if not args.force:
            print(_table(matching))
            import sys
            if not sys.stdin.isatty():
                raise CliError(f"{len(matching)} ACLs match: run again with --force to "
                               "remove them")
            if input(f"remove these {len(matching)} ACLs? [y/N] ").strip().lower() != "y":
                print("Nothing removed.")
                return 1
        removed = admin_call(lambda: admin.delete_acls(filters))
    print(f"removed {len(removed)} ACL{'s' if len(removed) != 1 else ''}:")
    print(_table(removed))
    return 0


def _list(args: argparse.Namespace) -> int:
    pattern = args.resource_pattern_type.upper()
    resources = _resources(args) or [(None, None)]
    with admin_client(args) as admin:
        found = sorted({b for rtype, name in resources for b in admin_call(
            lambda rtype=rtype, name=name: admin.describe_acls(acl.AclBindingFilter(
                rtype, name, pattern, args.principal)))})
    if not found:
        print("No ACLs. `kraftlog acls add` makes them.")
        return 0
    print(_table(found))
    return 0
