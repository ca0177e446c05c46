"""``kraftlog tokens create | renew | expire | list``: delegation tokens
(Kafka's ``kafka-delegation-tokens``): a job authenticates with a token made
by a user, instead of holding the user's password or certificate."""

from __future__ import annotations

import argparse
import datetime

from api.cli_support import admin_call, admin_client
from api.table import format_table


def add_commands(commands: argparse._SubParsersAction, formatter: type) -> None:
    tokens = commands.add_parser(
        "tokens", help="delegation tokens: create, renew, expire, list",
        formatter_class=formatter,
        description="A delegation token authenticates as the user who made it, on SASL_SSL "
                    "listeners, until it expires (renewable up to its maximum lifetime). "
                    "Needs delegation.token.secret.key.file on every node; made by users "
                    "authenticated with a password or a certificate (docs/security.md).",
        epilog="examples:\n"
               "  kraftlog tokens create --renewer-principal User:scheduler > job.token\n"
               "  kraftlog --security-protocol SASL_SSL --sasl-token-file job.token topics list\n"
               "  kraftlog tokens renew --token-file job.token\n"
               "  kraftlog tokens expire --token-file job.token\n"
               "  kraftlog tokens list")
    actions = tokens.add_subparsers(dest="tokens_command", metavar="ACTION")
    actions.required = True
    create = actions.add_parser("create", help="make a token; prints it (keep it secret)")
    create.add_argument("--renewer-principal", action="append", default=[],
                        metavar="PRINCIPAL", help="User:<name> who may renew it too, repeatable")
    create.add_argument("--max-life-time-period", type=int, default=-1, metavar="MS",
                        help="its maximum lifetime (default and cap: the cluster's "
                             "delegation.token.max.lifetime.ms)")
    create.set_defaults(handler=_create)
    for action, summary, period in (("renew", "push a token's expiry back",
                                     "--renew-time-period"),
                                    ("expire", "expire a token (now, or later)",
                                     "--expiry-time-period")):
        parser = actions.add_parser(action, help=summary)
        parser.add_argument("--token-file", required=True, metavar="FILE",
                            help="the token, the first line of FILE (as `create` prints it)")
        parser.add_argument(period, type=int, default=-1, metavar="MS", dest="period",
                            help="from now (default: the cluster's expiry time to renew, "
                                 "at once to expire)")
        parser.set_defaults(handler=_change)
    listing = actions.add_parser("list", help="the tokens you own or may renew")
    listing.add_argument("--owner-principal", action="append", metavar="PRINCIPAL",
                         help="only tokens of this owner, repeatable")
    listing.set_defaults(handler=_list)


def _when(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).strftime(
        "%Y-%m-%d %H:%M:%S UTC")


def _create(args: argparse.Namespace) -> int:
    import sys

    with admin_client(args) as admin:
        token = admin_call(lambda: admin.create_delegation_token(
            args.renewer_principal, max_lifetime_ms=args.max_life_time_period))
    print(token.value)  # alone on stdout: `> job.token` keeps just the token
    print(f"token {token.token_id} of {token.owner}: expires {_when(token.expiration_timestamp_ms)}"
          f", renewable until {_when(token.max_timestamp_ms)}", file=sys.stderr)
    return 0


def _token(path: str):
    from api.cli_support import CliError, read_secret
    from api.client import DelegationToken

    token_id, sep, mac = read_secret(path, "--token-file").strip().partition(".")
    if not sep:
        raise CliError(f"{path} does not hold a token (<id>.<hmac>, as `tokens create` "
                       "prints it)")
    return DelegationToken(token_id, mac, "", (), 0, 0, 0)


def _change(args: argparse.Namespace) -> int:
    token = _token(args.token_file)
    with admin_client(args) as admin:
        if args.tokens_command == "renew":
            expiry = admin_call(lambda: admin.renew_delegation_token(
                token, renew_period_ms=args.period))
        else:
            expiry = admin_call(lambda: admin.expire_delegation_token(
                token, expiry_period_ms=args.period))
    print(f"token {token.token_id} expires {_when(expiry)}")
    return 0


def _list(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        found = admin_call(lambda: admin.describe_delegation_token(args.owner_principal))
    if not found:
        print("No tokens. `kraftlog tokens create` makes one.")
        return 0
    print(format_table(("TOKEN ID", "OWNER", "RENEWERS", "EXPIRES", "MAX"), [
        (t.token_id, t.owner, ", ".join(t.renewers) or "-", _when(t.expiration_timestamp_ms),
         _when(t.max_timestamp_ms)) for t in found]))
    return 0
