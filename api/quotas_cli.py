"""``kraftlog quotas set | remove | list``: client quotas, as Kafka's
``kafka-configs --entity-type users|clients --alter --add-config
producer_byte_rate=...`` sets them."""

from __future__ import annotations

import argparse

from api.table import format_table

_KEYS = (("--producer-byte-rate", "producer_byte_rate", "BYTES_PER_S", "bytes per second"),
         ("--consumer-byte-rate", "consumer_byte_rate", "BYTES_PER_S", "bytes per second"),
         ("--request-percentage", "request_percentage", "PERCENT",
          "percent of the broker's event loop the client's requests may keep busy, "
          "over the quota window (Kafka's percent of a request handler thread)"))


def add_commands(commands: argparse._SubParsersAction, formatter: type) -> None:
    quotas = commands.add_parser(
        "quotas", help="client quotas: produce and fetch byte rates and request time per user / "
             "client id",
        formatter_class=formatter,
        description="Limit how fast a client may produce or fetch, and how much of a "
                    "broker's time its requests may take, by its user (User:<SCRAM name>, "
                    "its TLS certificate's subject, or User:ANONYMOUS), its client id "
                    "(client_id in the client, Kafka's client.id), or both; <default> "
                    "stands for every one without a quota of its own. A client over its "
                    "quota is slowed down (its answers are held back), never refused, and "
                    "nothing it sends is dropped (docs/security.md).",
        epilog="examples:\n"
               "  kraftlog quotas set --client-id reports --consumer-byte-rate 1048576\n"
               "  kraftlog quotas set --client-id '<default>' --producer-byte-rate 10485760\n"
               "  kraftlog quotas set --user 'User:CN=etl,O=acme' --producer-byte-rate 5e6\n"
               "  kraftlog quotas set --client-id dashboards --request-percentage 20\n"
               "  kraftlog quotas remove --client-id reports --consumer-byte-rate\n"
               "  kraftlog quotas list")
    actions = quotas.add_subparsers(dest="quotas_command", metavar="ACTION")
    actions.required = True
    set_parser = actions.add_parser("set", help="set quotas of a user and/or client id")
    remove = actions.add_parser("remove", help="remove quotas of a user and/or client id")
    for parser in (set_parser, remove):
        parser.add_argument("--user", help="the user (User:..., or <default>)")
        parser.add_argument("--client-id", help="the client id (or <default>)")
    for flag, key, metavar, unit in _KEYS:
        set_parser.add_argument(flag, type=float, metavar=metavar, dest=key,
                                help=f"{key}: {unit}")
        remove.add_argument(flag, action="store_true", dest=key, help=f"remove {key}")
    set_parser.set_defaults(handler=_set)
    remove.set_defaults(handler=_remove)
    listing = actions.add_parser("list", help="every user / client id with a quota")
    listing.set_defaults(handler=_list)


def _entity(args: argparse.Namespace) -> dict[str, str]:
    from api.cli_support import CliError

    entity = {k: v for k, v in (("user", args.user), ("client-id", args.client_id)) if v}
    if not entity:
        raise CliError("name a --user, a --client-id or both (<default> for every one)")
    return entity


def _alter(args: argparse.Namespace, changes: dict) -> int:
    from api.cli_support import CliError, client_security
    from api.client import Admin, KraftlogError

    if not changes:
        raise CliError("name at least one quota: " + ", ".join(flag for flag, *_ in _KEYS))
    entity = _entity(args)
    try:
        with Admin(args.bootstrap, request_timeout_ms=10_000, **client_security()) as admin:
            admin.alter_client_quotas(entity, changes)
    except KraftlogError as exc:
        raise CliError(f"{exc.code}: {exc.message}") from None
    what = ", ".join(f"{k}={v:g}" if v is not None else f"{k} removed"
                     for k, v in changes.items())
    print(f"{_describe(entity)}: {what}")
    return 0


def _set(args: argparse.Namespace) -> int:
    return _alter(args, {key: getattr(args, key) for _, key, *_ in _KEYS
                         if getattr(args, key) is not None})


def _remove(args: argparse.Namespace) -> int:
    return _alter(args, {key: None for _, key, *_ in _KEYS if getattr(args, key)})


def _describe(entity: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(entity.items(), reverse=True))


def _number(key: str, value: float) -> str:
    if key == "request_percentage":
        return f"{value:,.3f}".rstrip("0").rstrip(".") + "%"
    return f"{value:,.0f}"


def _list(args: argparse.Namespace) -> int:
    from api.cli_support import CliError, client_security
    from api.client import Admin, KraftlogError

    try:
        with Admin(args.bootstrap, request_timeout_ms=10_000, **client_security()) as admin:
            entries = admin.describe_client_quotas()
    except KraftlogError as exc:
        raise CliError(f"{exc.code}: {exc.message}") from None
    if not entries:
        print("No client quotas: every client may produce and fetch as fast as it can.")
        return 0
    rows = [(entity.get("user", "-"), entity.get("client-id", "-"),
             *(_number(key, quotas[key]) if key in quotas else "-" for _, key, *_ in _KEYS))
            for entity, quotas in entries]
    print(format_table(("USER", "CLIENT-ID", "PRODUCER-BYTE-RATE", "CONSUMER-BYTE-RATE",
                        "REQUEST-PERCENTAGE"), rows))
    return 0
