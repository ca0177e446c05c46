"""``kraftlog users create | set-password | delete | list``: SCRAM users
(Kafka's ``kafka-configs --alter --add-config 'SCRAM-SHA-512=[password=...]'
--entity-type users``). Passwords are read from a file or typed at a prompt,
never taken on the command line (where ``ps`` and shell history keep them)."""

from __future__ import annotations

import argparse
import os
import sys

from api.cli_support import admin_call, admin_client
from api.table import format_table

MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256")


def add_commands(commands: argparse._SubParsersAction, formatter: type) -> None:
    users = commands.add_parser(
        "users", help="SCRAM users for SASL_SSL listeners: create, set-password, delete, list",
        formatter_class=formatter,
        description="Users a client authenticates as on a SASL_SSL listener (name and "
                    "password inside TLS). The cluster keeps only salted, iterated keys "
                    "derived from each password, in its metadata (docs/security.md).",
        epilog="examples:\n"
               "  kraftlog users create etl --password-file etl.secret\n"
               "  kraftlog users create analyst            # asks for the password\n"
               "  kraftlog users set-password etl --password-file new.secret\n"
               "  kraftlog users delete etl\n"
               "  kraftlog users list")
    actions = users.add_subparsers(dest="users_command", metavar="ACTION")
    actions.required = True
    for action, summary in (("create", "add a user"),
                            ("set-password", "give a user a new password")):
        parser = actions.add_parser(action, help=summary)
        parser.add_argument("name", metavar="NAME", help="the user's name")
        parser.add_argument("--password-file", metavar="FILE",
                            help="read the password from FILE (its first line); default: "
                                 "ask, or $KRAFTLOG_NEW_PASSWORD")
        parser.add_argument("--mechanism", choices=MECHANISMS, default=MECHANISMS[0],
                            help="SCRAM mechanism (default %(default)s)")
        parser.add_argument("--iterations", type=int, default=8192,
                            help="PBKDF2 iterations, 4096-16384 (default %(default)s)")
        parser.set_defaults(handler=_upsert)
    delete = actions.add_parser("delete", help="remove a user")
    delete.add_argument("name", metavar="NAME", help="the user to remove")
    delete.add_argument("--mechanism", choices=MECHANISMS,
                        help="remove only this credential (default: the user)")
    delete.set_defaults(handler=_delete)
    listing = actions.add_parser("list", help="every user, its mechanisms and iterations")
    listing.set_defaults(handler=_list)


def _password(args: argparse.Namespace) -> str:
    from api.cli_support import CliError, read_secret

    if args.password_file:
        password = read_secret(args.password_file, "--password-file")
    elif os.environ.get("KRAFTLOG_NEW_PASSWORD"):
        password = os.environ["KRAFTLOG_NEW_PASSWORD"]
    elif sys.stdin.isatty():
        import getpass
        password = getpass.getpass(f"password for {args.name}: ")
        if getpass.getpass("again: ") != password:
            raise CliError("the two passwords differ")
    else:
        raise CliError("give the password with --password-file FILE (or "
                       "$KRAFTLOG_NEW_PASSWORD), or run in a terminal to be asked")
    if len(password) < 8:
        raise CliError("a password must be at least 8 characters")
    return password






def _upsert(args: argparse.Namespace) -> int:
    password = _password(args)
    with admin_client(args) as admin:
        admin_call(lambda: admin.upsert_user(args.name, password, mechanism=args.mechanism,
                                       iterations=args.iterations))
    verb = "created" if args.users_command == "create" else "has a new password"
    print(f"user {args.name} {verb} ({args.mechanism}, {args.iterations} iterations)")
    return 0


def _delete(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        admin_call(lambda: admin.delete_user(args.name, mechanism=args.mechanism))
    print(f"user {args.name} deleted" if args.mechanism is None
          else f"user {args.name}: {args.mechanism} credential deleted")
    return 0


def _list(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        users = admin_call(admin.describe_users)
    if not users:
        print("No users. `kraftlog users create NAME` makes one.")
        return 0
    print(format_table(("USER", "MECHANISMS"), [
        (name, ", ".join(f"{m} ({i} iterations)" for m, i in sorted(creds.items())))
        for name, creds in sorted(users.items())]))
    return 0
