"""``kraftlog chaos run | scenarios | check``: the chaos harness's commands."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from api.table import format_table
from chaos import checker, nemesis, runner
from chaos.workload import read_history


def add_commands(actions: argparse._SubParsersAction, formatter: type) -> None:
    run = actions.add_parser(
        "run", help="one chaos run: cluster, workload, faults, final read, verdict",
        formatter_class=formatter,
        description="Start a fresh cluster of real processes, write unique values with "
                    "acks=all from several producers while live consumers read, and let the "
                    "scenario's nemesis inject faults for --duration seconds (a seeded "
                    "schedule: quiet, fault, heal, again). Then heal everything, read every "
                    "partition back and check the history Jepsen-style. Writes "
                    "DIR/history.jsonl, DIR/results.json and DIR/report.html (a timeline "
                    "with the faults shaded); node logs and data stay in DIR/cluster/. "
                    "Exit status 0 when the checker passes, 1 when it finds an anomaly, 2 "
                    "when the harness itself failed (nothing proven; see DIR/cluster/ logs), "
                    "3 when the scenario cannot run on this machine (the reason is printed).",
        epilog="examples:\n"
               "  kraftlog chaos run --scenario kill-two --duration 600 --seed 7 --out runs/k2\n"
               "  kraftlog chaos run --scenario partition --secure --duration 300 --out runs/p\n"
               "  kraftlog chaos run --scenario pause-kill --unsafe-ack-before-replication "
               "--duration 30 --out /tmp/broken   # must FAIL")
    run.add_argument("--scenario", required=True, choices=sorted(nemesis.SCENARIOS),
                     metavar="NAME", help="which faults to inject (see `kraftlog chaos "
                                          "scenarios`)")
    run.add_argument("--duration", type=_positive_float, default=60.0, metavar="SECONDS",
                     help="how long faults are injected (default %(default)s)")
    run.add_argument("--seed", type=int, default=1, help="seed of the schedule, targets and "
                                                         "keys (default %(default)s)")
    run.add_argument("--out", metavar="DIR",
                     help="where the history, results, report and node logs go "
                          "(default: a new directory under the system temp dir)")
    run.add_argument("--combined", action="store_true",
                     help="nodes that are both controller and broker instead of dedicated "
                          "controllers and brokers")
    run.add_argument("--controllers", type=_positive_int, default=3,
                     help="controllers, or combined nodes with --combined (default 3)")
    run.add_argument("--brokers", type=_positive_int, default=3,
                     help="dedicated brokers (default 3)")
    run.add_argument("--partitions", type=_positive_int, default=3,
                     help="partitions of the test topic (default 3)")
    run.add_argument("--producers", type=_positive_int, default=3,
                     help="producer threads (default 3)")
    run.add_argument("--consumers", type=int, default=2,
                     help="live consumers reading every partition (default 2)")
    run.add_argument("--rate", type=_positive_float, default=300.0, metavar="WRITES_PER_S",
                     help="total acks=all writes per second (default %(default)s)")
    run.add_argument("--workload", choices=("plain", "idempotent", "transactional"),
                     default="plain",
                     help="plain: producers send each write once (retries=0); idempotent: "
                          "the client retries every failure itself with idempotence on, "
                          "and the checker fails the run on any duplicate; transactional: "
                          "producers write transactions over several partitions, commit or "
                          "abort them, and read_committed consumers must never see an "
                          "aborted or partial one (default plain)")
    run.add_argument("--namespaces", action="store_true",
                     help="run every node in its own network namespace even when the "
                          "scenario cuts no links (partition scenarios always do)")
    run.add_argument("--secure", action="store_true",
                     help="TLS on every listener, the brokers' SASL_SSL, ACLs on: a CA "
                          "and node and client certificates are made for the run in "
                          "DIR/cluster/certs; nodes replicate and register over TLS with "
                          "their certificates (required: ssl.client.auth = required) and "
                          "the harness administers with the client certificate, super users "
                          "all; the workload and the final read log in as the SCRAM user "
                          "chaos-workload, allowed only what they do. Works with "
                          "--namespaces (the certificates name the namespace addresses)")
    run.add_argument("--unsafe-ack-before-replication", action="store_true",
                     help="run a deliberately BROKEN cluster (acks=all answered before "
                          "replication, unclean election on) to show the checker catches it")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     dest="overrides", help="a node config setting for every node "
                                            "(repeatable)")
    run.set_defaults(handler=_run)

    scenarios = actions.add_parser(
        "scenarios", help="list the scenarios and what each proves",
        description="List the scenarios `chaos run --scenario` accepts, the faults each "
                    "draws from, and what a passing run of it shows.")
    scenarios.set_defaults(handler=_scenarios)

    check = actions.add_parser(
        "check", help="check a run's history again and rewrite its results and report",
        description="Run the checker on DIR/history.jsonl (for example after changing the "
                    "checker, or on a history from another machine), print the verdict "
                    "and rewrite DIR/results.json and DIR/report.html.")
    check.add_argument("dir", metavar="DIR", help="a chaos run's output directory")
    check.set_defaults(handler=_check)

    fuzz = actions.add_parser(
        "fuzz", help="fuzz every HTTP endpoint of a fresh cluster for a while",
        formatter_class=formatter,
        description="Start a fresh cluster of real processes (1 controller and --brokers "
                    "brokers) and send seeded, mutated requests to every broker and "
                    "controller endpoint for --duration seconds: fields of other types or "
                    "extreme values, missing and unknown fields, huge lists, deep nesting, "
                    "flipped and cut record batches, invalid names, mangled msgpack, the "
                    "wrong content type. Fails on any 500 or UNKNOWN_SERVER_ERROR, a refusal "
                    "without an error code and message, a dropped connection, an answer "
                    "slower than any allowed wait, a node that died, or a cluster that no "
                    "longer takes and serves acks=all writes afterwards. Exit status 0: "
                    "nothing found; 1: findings (written to DIR/findings.jsonl with the "
                    "input that caused each).",
        epilog="examples:\n"
               "  kraftlog chaos fuzz --duration 600 --seed 3\n"
               "  kraftlog chaos fuzz --duration 60 --corpus tests/fuzz_corpus/corpus.jsonl\n"
               "  kraftlog chaos fuzz --duration 300 --save-corpus /tmp/new.jsonl")
    fuzz.add_argument("--duration", type=_positive_float, default=60.0, metavar="SECONDS",
                      help="how long random inputs are sent (default %(default)s)")
    fuzz.add_argument("--seed", type=int, default=1, help="seed of the inputs (default 1)")
    fuzz.add_argument("--brokers", type=_positive_int, default=3, help="brokers (default 3)")
    fuzz.add_argument("--corpus", metavar="FILE",
                      help="JSON lines of inputs to send first (a kept corpus)")
    fuzz.add_argument("--save-corpus", metavar="FILE",
                      help="append the interesting inputs of this run (the first to reach "
                           "each route, status and error code; bodies up to 16 KiB) to FILE")
    fuzz.add_argument("--out", metavar="DIR", help="where findings and node logs go "
                                                   "(default: a new temp directory)")
    fuzz.add_argument("--json", action="store_true", help="print the summary as JSON")
    fuzz.set_defaults(handler=_fuzz)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {value}")
    return value


def _run(args: argparse.Namespace) -> int:
    from api.cli_support import CliError
    from chaos.local_cluster import parse_setting

    settings = {}
    for item in args.overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise CliError(f"--set {item!r} must look like key=value")
        if key.strip() == "unsafe.ack.before.replication":
            raise CliError("use --unsafe-ack-before-replication to run a broken cluster, so "
                           "the results say so")
        settings[key.strip()] = parse_setting(value.strip())
    out_dir = args.out or tempfile.mkdtemp(prefix=f"kraftlog-chaos-{args.scenario}-")
    if os.path.exists(os.path.join(out_dir, "history.jsonl")):
        raise CliError(f"{out_dir} already holds a run (history.jsonl); choose another --out")
    config = runner.RunConfig(
        scenario=args.scenario, duration_s=args.duration, seed=args.seed, out_dir=out_dir,
        controllers=args.controllers, brokers=args.brokers, combined=args.combined,
        partitions=args.partitions, producers=args.producers, consumers=args.consumers,
        rate=args.rate, unsafe_ack_before_replication=args.unsafe_ack_before_replication,
        namespaces=args.namespaces, workload=args.workload,
        settings=settings, secure=args.secure)
    results = runner.run(config, runner.main_say)
    print(runner.summary(results, out_dir))
    return runner.exit_status(results)


def _scenarios(args: argparse.Namespace) -> int:
    rows = [(s.name, ", ".join(s.nemeses) if len(s.nemeses) < 4 else "all but pause-kill",
             "yes" if any(n in nemesis.NETWORK_NEMESES for n in s.nemeses) else "no", s.proves)
            for s in nemesis.SCENARIOS.values()]
    print(format_table(("Scenario", "Faults", "Namespaces", "Proves"), rows))
    return 0


def _check(args: argparse.Namespace) -> int:
    from api.cli_support import CliError

    path = os.path.join(args.dir, "history.jsonl")
    if not os.path.exists(path):
        raise CliError(f"{path} does not exist: give the --out directory of a chaos run")
    events = read_history(path)
    results = checker.check(events)
    results["faults"] = runner.faults_from_events(events)
    previous_path = os.path.join(args.dir, "results.json")
    if os.path.exists(previous_path):  # keep what only the run knew
        with open(previous_path) as f:
            previous = json.load(f)
        for key in ("layout", "nemeses", "network", "security_protocol",
                    "unsafe_ack_before_replication", "config"):
            if key in previous:
                results[key] = previous[key]
    runner.write_results(args.dir, results, events, runner.main_say)
    print(runner.summary(results, args.dir))
    print(f"rewrote {os.path.join(args.dir, 'results.json')}", file=sys.stderr)
    return runner.exit_status(results)


def _fuzz(args: argparse.Namespace) -> int:
    from chaos import fuzz

    out_dir = args.out or tempfile.mkdtemp(prefix="kraftlog-fuzz-")
    corpus = fuzz.read_corpus(args.corpus) if args.corpus else []
    summary, interesting = fuzz.run(out_dir, args.brokers, args.seed, args.duration, corpus,
                                    say=lambda text: print(text, file=sys.stderr))
    if args.save_corpus:
        with open(args.save_corpus, "a", encoding="utf-8") as f:
            for item in interesting:
                if len(item.data) <= fuzz.CORPUS_INPUT_BYTES_MAX:
                    f.write(item.to_json() + "\n")
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(fuzz.summary_text(summary))
    return 1 if summary["findings"] or not summary["cluster_ok"] else 0
