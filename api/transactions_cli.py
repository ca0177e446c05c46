"""``kraftlog transactions list | describe | abort``: transactional ids as
``kafka-transactions.sh`` shows them."""

from __future__ import annotations

import argparse
import time
import urllib.parse

from api.table import format_table


def add_commands(commands: argparse._SubParsersAction, formatter: type) -> None:
    transactions = commands.add_parser(
        "transactions", help="transactional producers: state, partitions, abort",
        formatter_class=formatter,
        description="Inspect and abort transactions (kafka-transactions.sh). Every "
                    "transactional id lives on one broker, its transaction coordinator; any "
                    "broker finds it.",
        epilog="examples:\n"
               "  kraftlog transactions list\n"
               "  kraftlog transactions describe orders-app\n"
               "  kraftlog transactions abort orders-app")
    actions = transactions.add_subparsers(dest="transactions_command", metavar="ACTION")
    actions.required = True
    listing = actions.add_parser("list", help="every transactional id with its state")
    listing.set_defaults(handler=_list)
    describe = actions.add_parser(
        "describe", help="producer id and epoch, state, timeout, partitions of one id")
    describe.add_argument("transactional_id", metavar="TRANSACTIONAL_ID",
                          help="the producer's transactional_id")
    describe.set_defaults(handler=_describe)
    abort = actions.add_parser(
        "abort", help="abort an id's open transaction (its producer is fenced)",
        description="Abort the open transaction of TRANSACTIONAL_ID, as a timeout would: the "
                    "producer epoch is bumped, so the producer that left it open is fenced, "
                    "and read_committed consumers move past its records.")
    abort.add_argument("transactional_id", metavar="TRANSACTIONAL_ID",
                       help="the producer's transactional_id")
    abort.set_defaults(handler=_abort)


def _get(args: argparse.Namespace, path: str) -> dict:
    from api.console import inspect_json

    return inspect_json(args, path)


def _list(args: argparse.Namespace) -> int:
    rows = [(t["transactional_id"], str(t["producer_id"]), t["state"],
             str(t.get("coordinator_id", "-")))
            for t in _get(args, "/v1/transactions")["transactions"]]
    if not rows:
        print("No transactional ids. A producer with a transactional_id creates one when it "
              "calls init_transactions().")
        return 0
    print(format_table(("TRANSACTIONAL-ID", "PRODUCER-ID", "STATE", "COORDINATOR"), rows))
    return 0


def _describe(args: argparse.Namespace) -> int:
    txn = _get(args, "/v1/transactions?transactional_id=" +
               urllib.parse.quote(args.transactional_id, safe=""))
    started = txn["txn_start_ms"]
    running = (f"{max(0, int(time.time() * 1000) - started) / 1000:.1f} s"
               if started >= 0 and txn["state"] == "Ongoing" else "-")
    partitions = ",".join(f"{p['topic']}-{p['partition']}" for p in txn["partitions"]) or "-"
    print(format_table(
        ("TRANSACTIONAL-ID", "COORDINATOR", "PRODUCER-ID", "EPOCH", "STATE", "TIMEOUT-MS",
         "RUNNING-FOR", "PARTITIONS"),
        [(txn["transactional_id"], str(txn["coordinator_id"]), str(txn["producer_id"]),
          str(txn["producer_epoch"]), txn["state"], str(txn["timeout_ms"]), running,
          partitions)]))
    return 0


def _abort(args: argparse.Namespace) -> int:
    from api.cli_support import CliError, post_json

    answer = post_json(args.bootstrap.rstrip("/") + "/v1/admin/transactions/abort",
                       {"transactional_id": args.transactional_id})
    if isinstance(answer, dict) and isinstance(answer.get("error"), dict):
        raise CliError(f"{answer['error'].get('code')}: {answer['error'].get('message')}")
    print(f"Aborting the open transaction of {args.transactional_id}; its producer is fenced.")
    return 0
