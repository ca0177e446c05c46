"""``kraftlog chaos run``: one chaos run from start to verdict.

1. **Cluster**: real ``kraftlog node`` processes (3 controllers + 3 brokers
   by default, or combined nodes) with ``configs/chaos.toml`` and the fast
   timeouts of ``chaos/cluster.py``. Scenarios with network partitions put
   each node in its own network namespace (``chaos/netns.py``); where the
   machine cannot, the run is reported as not run, with the reason. With
   ``secure`` every listener is TLS, the brokers' SASL_SSL, and ACLs are on
   (``authorizer.class.name``): a CA and certificates are made for the run
   under ``DIR/cluster/certs``; the nodes call each other, and the harness
   administers (topic, nemesis probes, the copier's offsets), with
   certificates required on every SSL listener (``ssl.client.auth =
   required``), super users; the workload and the final read log in as
   the SCRAM user ``WORKLOAD_USER`` with only the ACLs it needs
   (``WORKLOAD_GRANTS``).
2. **Topic**: ``partitions`` partitions, replication factor 3 (or the number
   of brokers if fewer), ``min.insync.replicas`` 2.
3. **Workload** (``chaos/workload.py``) for ``duration_s`` while the
   **nemesis** (``chaos/nemesis.py``) loops: quiet for a seeded while, one
   fault drawn from the scenario, held for a seeded while, healed; it waits
   for the cluster to serve again before the next quiet spell.
4. **Heal** everything (network, paused and dead nodes), wait until every
   broker serves, let the workload run ``RECOVER_S`` more, stop it.
5. **Final read** once every partition has its whole ISR back.
6. **Check** (``chaos/checker.py``) and **report**: ``DIR/history.jsonl``,
   ``DIR/results.json``, ``DIR/report.html``; node logs and data stay in
   ``DIR/cluster/``.

The random choices (fault order, targets, timing, keys) come from ``seed``.
Timing of the real processes does not, so a seed reproduces the schedule,
not every interleaving.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import ssl
import sys
import time
import tomllib
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from chaos import checker, faultyio, nemesis, netns, resources
from chaos.cluster import FAST_SETTINGS, REPO_ROOT, ProcessCluster, wait_until
from chaos.workload import (ClientSecurity, History, Workload, final_read, read_history,
                            record_copier_offsets)

TOPIC = "chaos"
#: A ``secure`` run's workload logs in as this SCRAM user (a password made
#: for the run), allowed only what it does: read and write the run's topics
#: (``chaos``, ``chaos-copy``), read as the copier's group, write as its
#: transactional ids (``chaos-<seed>...``).
WORKLOAD_USER = "chaos-workload"


def workload_grants() -> list:
    from api.client import AclBinding
    from protocol import acl

    user = "User:" + WORKLOAD_USER
    return [AclBinding(resource, name, acl.PREFIXED, user, acl.WILDCARD, operation, acl.ALLOW)
            for resource, name, operation in (
                (acl.TOPIC, TOPIC, acl.READ), (acl.TOPIC, TOPIC, acl.WRITE),
                (acl.GROUP, TOPIC, acl.READ), (acl.TRANSACTIONAL_ID, TOPIC + "-", acl.WRITE))]


CHAOS_CONFIG = os.path.join(REPO_ROOT, "configs", "chaos.toml")
#: Keys of configs/chaos.toml the harness sets per node instead.
LAYOUT_KEYS = frozenset({"process.roles", "log.dirs", "log.dir", "node.id", "listeners",
                         "controller.quorum.voters", "metadata.log.dir"})
#: Settings the harness adds on top of configs/chaos.toml and FAST_SETTINGS.
CHAOS_SETTINGS: dict[str, Any] = {
    # Followers silent this long leave the ISR: pauses and cuts shrink it.
    "replica.lag.time.max.ms": 4000,
}
#: Bounds on waits (seconds).
CLUSTER_START_S = 60.0
SETTLE_S = 60.0
FULL_ISR_S = 90.0
FINAL_READ_S = 120.0
STOP_WORKLOAD_S = 120.0
#: After the last fault is healed, the workload runs this long more.
RECOVER_S = 3.0
#: Exit statuses of ``kraftlog chaos run``: passed, an anomaly, the harness
#: failed (nothing proven either way), the scenario cannot run here.
EXIT_PASS, EXIT_FAIL, EXIT_UNKNOWN, EXIT_NOT_RUN = 0, 1, 2, 3


@dataclass
class RunConfig:
    scenario: str
    duration_s: float
    seed: int
    out_dir: str
    controllers: int = 3
    brokers: int = 3
    combined: bool = False
    partitions: int = 3
    producers: int = 3
    consumers: int = 2
    rate: float = 300.0
    #: Seconds without faults before each fault, and each fault's hold: (low, high).
    quiet_s: tuple[float, float] = (2.0, 5.0)
    fault_s: tuple[float, float] = (3.0, 8.0)
    unsafe_ack_before_replication: bool = False
    #: Nodes in network namespaces even when no fault cuts links.
    namespaces: bool = False
    #: "plain" (each write sent once) or "idempotent" (the client retries).
    workload: str = "plain"
    settings: dict[str, Any] = field(default_factory=dict)
    #: TLS on every listener, SASL_SSL brokers, ACLs: the workload logs in as
    #: a SCRAM user, the harness administers with the run's client certificate.
    secure: bool = False

    @property
    def layout(self) -> str:
        nodes = (f"{self.controllers} combined nodes" if self.combined
                 else f"{self.controllers} controllers + {self.brokers} brokers")
        return nodes + (", TLS, SASL, ACLs" if self.secure else "")

    @property
    def security_protocol(self) -> str:
        """The workload's."""
        return "SASL_SSL" if self.secure else "PLAINTEXT"


def node_settings(config: RunConfig) -> dict[str, Any]:
    with open(CHAOS_CONFIG, "rb") as f:
        base = {k: v for k, v in tomllib.load(f).items() if k not in LAYOUT_KEYS}
    brokers = config.controllers if config.combined else config.brokers
    settings = {**base, **FAST_SETTINGS, **CHAOS_SETTINGS,
                "num.partitions": config.partitions,
                "default.replication.factor": min(3, brokers),
                "min.insync.replicas": min(2, brokers)}
    # As docs/quorum.md asks before the voters change (the controller-
    # membership nemesis rewrites a controller's voter list): one cluster id
    # on every node, not one derived from each node's own list.
    settings.setdefault("cluster.id", f"kraftlog-chaos-{config.seed}")
    if config.unsafe_ack_before_replication:
        settings["unsafe.ack.before.replication"] = True
        settings["unclean.leader.election.enable"] = True
    if config.secure:
        # The protocol map and the certificate files come from ProcessCluster.
        settings["ssl.client.auth"] = "required"
    scenario = nemesis.SCENARIOS.get(config.scenario)
    if scenario is not None and "clock" in scenario.nemeses:
        # What a stepped clock could break shows within a fault's hold:
        # time-based retention and producer-state expiry look every second,
        # and segments roll every 64 KiB, so there are closed ones to delete.
        settings["log.retention.check.interval.ms"] = 1000
        settings["producer.id.expiration.check.interval.ms"] = 1000
        settings["log.segment.bytes"] = 65_536
        settings["log.retention.ms"] = 7 * 86_400_000  # a week, as Kafka's default
    if scenario is not None and "power-all" in scenario.nemeses:
        # What kraftlog promises when every replica loses power at once
        # (docs/durability.md): with each append fsynced before it returns.
        settings["log.flush.interval.messages"] = 1
    settings.update(config.settings)
    return settings


def run(config: RunConfig, say: Callable[[str], None] = print) -> dict[str, Any]:
    """One run; its results (also in ``out_dir/results.json``)."""
    scenario = nemesis.SCENARIOS.get(config.scenario)
    if scenario is None:
        raise ValueError(f"unknown scenario {config.scenario!r}; scenarios: "
                         f"{', '.join(nemesis.SCENARIOS)}")
    os.makedirs(config.out_dir, exist_ok=True)
    nemeses = list(scenario.nemeses)
    if config.combined and set(nemeses) <= {"power", "power-all"}:
        # A controller's machine crash is the simulation's to prove: with
        # every broker a controller, these faults would have no target.
        return _not_run(config, "power loss strikes brokers that are not controllers: run "
                        "without --combined", say)
    use_network = config.namespaces or any(n in nemesis.NETWORK_NEMESES for n in nemeses)
    reason = netns.unavailable_reason() if use_network else None
    if reason is not None and config.namespaces:
        return _not_run(config, f"--namespaces needs network namespaces: {reason}", say)
    if reason is not None:
        skipped = [n for n in nemeses if n in nemesis.NETWORK_NEMESES]
        nemeses = [n for n in nemeses if n not in nemesis.NETWORK_NEMESES]
        if not nemeses:
            return _not_run(config, f"network partitions need network namespaces: {reason}",
                            say)
        say(f"not running {', '.join(skipped)}: {reason}")
        use_network = False
    network = None
    if use_network:
        try:
            netns.sweep_stale()
            network = netns.Network(_node_ids(config))
            network.setup()
        except netns.NetworkError as exc:
            return _not_run(config, f"could not set up network namespaces: {exc}", say)
    try:
        return _run(config, nemeses, network, say)
    finally:
        if network is not None:
            try:
                network.teardown()
            except netns.NetworkError as exc:
                say(f"warning: network namespaces not fully removed ({exc}); "
                    "the next run with namespaces sweeps them")


def _node_ids(config: RunConfig) -> list[int]:
    count = config.controllers if config.combined else config.controllers + config.brokers
    return list(range(1, count + 1))


def _run(config: RunConfig, nemeses: list[str], network: Any,
         say: Callable[[str], None]) -> dict[str, Any]:
    rng = random.Random(config.seed)
    history = History(os.path.join(config.out_dir, "history.jsonl"))
    settings = node_settings(config)
    cluster = ProcessCluster(os.path.join(config.out_dir, "cluster"), config.controllers,
                             config.brokers, config.combined, settings, network=network,
                             tls=config.secure, acls=config.secure, sasl=config.secure,
                             log_dirs=2 if "disk" in nemeses else 1)
    # chaos.faultyio in every node for the disk and clock nemeses: a
    # broker's second log dir can be given disk errors, any node's wall
    # clock stepped.
    # The power nemeses: every broker journals its syncs, to be cut back to
    # them when its machine "loses power".
    controls: dict[int, faultyio.FaultyDir] = {}
    power = bool({"power", "power-all"} & set(nemeses))
    syncs = ({b: os.path.join(config.out_dir, f"syncs-{b}") for b in cluster.broker_ids}
             if power else {})
    if "disk" in nemeses or "clock" in nemeses or power:
        for node_id in sorted(cluster.nodes):
            dirs = cluster.log_dirs_of(node_id)
            controls[node_id] = faultyio.FaultyDir(
                dirs[1] if "disk" in nemeses and node_id in cluster.broker_ids else dirs[0],
                os.path.join(config.out_dir, f"faultyio-{node_id}"))
            cluster.env[node_id] = controls[node_id].env(syncs=syncs.get(node_id))
    disks = ({b: controls[b] for b in cluster.broker_ids} if "disk" in nemeses else {})
    # The harness as administrator; the workload as itself (a SCRAM user).
    operator = security = ClientSecurity(cluster.client_security, cluster.ssl_context)
    password = secrets.token_urlsafe(18)
    if config.secure:
        security = ClientSecurity(cluster.user_security(WORKLOAD_USER, password),
                                  ssl.create_default_context(
                                      cafile=cluster.certs["ca"].certfile))
    settings = dict(cluster.settings)  # with the TLS settings the cluster added
    target = nemesis.Target(cluster, TOPIC, config.partitions, rng, network,
                            log=lambda line: history.record({"type": "nemesis",
                                                             "phase": "info", "detail": line}),
                            disks=disks, clocks=controls if "clock" in nemeses else {},
                            syncs=syncs)
    history.record({"type": "run", "scenario": config.scenario, "seed": config.seed,
                    "duration_s": config.duration_s, "topic": TOPIC,
                    "partitions": config.partitions, "layout": config.layout,
                    "nemeses": nemeses, "network": "namespaces" if network else "loopback",
                    "security_protocol": config.security_protocol,
                    "unsafe_ack_before_replication": config.unsafe_ack_before_replication,
                    "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "settings": settings, "config": _jsonable(asdict(config))})
    workload: Workload | None = None
    sampler: resources.Sampler | None = None
    try:
        say(f"starting {config.layout} ({'network namespaces' if network else 'loopback'}) "
            f"in {config.out_dir}")
        cluster.start()
        nemesis.wait_serving(cluster, sorted(cluster.nodes), CLUSTER_START_S)
        if config.secure:
            cluster.add_user(WORKLOAD_USER, password, workload_grants(), CLUSTER_START_S)
        _create_topic(cluster, config, settings, operator)
        workload = Workload(lambda: _broker_urls(cluster), TOPIC, config.partitions, history,
                            security=security, producers=config.producers,
                            consumers=config.consumers, rate=config.rate, seed=config.seed,
                            idempotent=config.workload == "idempotent",
                            transactional=config.workload == "transactional")
        history.record({"type": "workload", "producer": workload.producer_settings(),
                        "user": WORKLOAD_USER if config.secure else None,
                        "security_protocol": config.security_protocol,
                        # What the clients were given (names only, no secrets).
                        "security_settings": sorted(security.settings)})
        history.record({"type": "phase", "name": "workload"})
        workload.start()
        sampler = resources.Sampler(
            lambda: {n: node.process.pid for n, node in cluster.nodes.items()
                     if node.running and not node.paused},
            os.path.realpath(cluster.base_dir), history.record).start()
        _nemesis_loop(config, nemeses, target, history, workload, say)
        history.record({"type": "phase", "name": "heal"})
        _heal_everything(target, history)
        nemesis.wait_serving(cluster, sorted(cluster.nodes), SETTLE_S)
        history.record({"type": "phase", "name": "recover"})
        time.sleep(RECOVER_S)
        workload.stop_producers(STOP_WORKLOAD_S)
        _wait_full_isr(target)
        workload.stop_consumers(STOP_WORKLOAD_S)
        history.record({"type": "phase", "name": "drain"})
        say("final read ...")
        count = final_read(_broker_urls(cluster), TOPIC, config.partitions, history,
                           FINAL_READ_S, workload.isolation_level, security=security)
        if workload.transactional:
            # The copies first: reading them waits until no transaction is
            # open, after which the copier's offsets stay put.
            copies = final_read(_broker_urls(cluster), workload.copy_topic, config.partitions,
                                history, FINAL_READ_S, "read_committed", kind="copy-drain",
                                security=security)
            record_copier_offsets(_broker_urls(cluster), TOPIC, config.partitions, history,
                                  workload.copier_id, security=operator)
            say(f"copies read: {copies:,}")
            if copies == 0:
                # Nothing copied proves nothing about exactly-once: the
                # copier failed throughout (its errors are in the history).
                raise RuntimeError("the transactional copier copied nothing: see its "
                                   "copier-error events in history.jsonl")
        say(f"final read: {count:,} records")
    except Exception as exc:  # noqa: BLE001  the run fails with its reason
        error = f"{type(exc).__name__}: {exc}"
        history.record({"type": "harness-error", "error": error,
                        "traceback": traceback.format_exc()})
        say(f"the run could not finish: {error} (node logs: {cluster.base_dir})")
    finally:
        try:
            if sampler is not None:
                sampler.stop()
            _heal_everything(target, history, start_dead=False)
        finally:
            if workload is not None:
                workload.abort()
            cluster.stop()
            history.record({"type": "phase", "name": "check"})
            history.close()
    events = read_history(history.path)
    results = checker.check(events)
    results.update(faults=faults_from_events(events), layout=config.layout, nemeses=nemeses,
                   network="namespaces" if network else "loopback",
                   security_protocol=config.security_protocol,
                   unsafe_ack_before_replication=config.unsafe_ack_before_replication,
                   config=_jsonable(asdict(config)))
    write_results(config.out_dir, results, events, say)
    return results


def faults_from_events(events: list[dict]) -> list[dict]:
    """Each fault window of a history: its start, end (None if the run ended
    first), fault, targets and detail."""
    faults: list[dict] = []
    open_windows: dict[tuple, dict] = {}
    for event in events:
        if event.get("type") != "nemesis" or event.get("phase") not in ("start", "end"):
            continue
        key = (event.get("fault"), tuple(event.get("targets") or ()))
        if event["phase"] == "start":
            window = {"fault": event.get("fault"), "start": event["t"], "end": None,
                      "targets": list(key[1]), "detail": event.get("detail", "")}
            faults.append(window)
            open_windows[key] = window
        elif key in open_windows:
            open_windows.pop(key)["end"] = event["t"]
    return faults


def _nemesis_loop(config: RunConfig, nemeses: list[str], target: nemesis.Target,
                  history: History, workload: Workload,
                  say: Callable[[str], None]) -> None:
    rng = target.rng
    started = time.monotonic()
    deadline = started + config.duration_s
    scenario = nemesis.SCENARIOS.get(config.scenario)
    # A scenario may name the fault it must show even in a short run: drawn
    # until it is injected once, then the draw is random.
    first = scenario.first if scenario is not None and scenario.first in nemeses else None
    while True:
        quiet = rng.uniform(*config.quiet_s)
        if time.monotonic() + quiet >= deadline:
            time.sleep(max(0.0, deadline - time.monotonic()))
            return
        time.sleep(quiet)
        name = first or rng.choice(nemeses)
        start_t = history.now()
        fault = nemesis.NEMESES[name](target)
        if fault is None:
            history.record({"type": "nemesis", "phase": "info", "fault": name,
                            "detail": "no target right now (no live leader or controller)"})
            continue
        history.record({"type": "nemesis", "phase": "start", "t": start_t,
                        "fault": fault.name, "targets": fault.targets, "detail": fault.detail})
        first = None
        elapsed = time.monotonic() - started
        say(f"[{elapsed:6.1f}/{config.duration_s:g} s] {fault.detail}; {workload.tally.line()}")
        hold = rng.uniform(*config.fault_s) if fault.hold else 0.0
        time.sleep(min(hold, max(0.0, deadline - time.monotonic())))
        fault.heal()
        end_t = history.now()
        history.record({"type": "nemesis", "phase": "end", "t": end_t, "fault": fault.name,
                        "targets": fault.targets, "detail": "healed"})
        try:
            nemesis.wait_serving(target.cluster, sorted(target.cluster.nodes), SETTLE_S)
        except TimeoutError as exc:
            history.record({"type": "nemesis", "phase": "info", "detail": str(exc)})
            raise


def _heal_everything(target: nemesis.Target, history: History, start_dead: bool = True
                     ) -> None:
    """Whatever is still broken: cuts removed, paused nodes resumed, and
    (``start_dead``) dead nodes started."""
    if target.network is not None:
        target.network.heal()
    for faulty in {**target.disks, **target.clocks}.values():
        faulty.clear()
    cluster = target.cluster
    for node_id, node in cluster.nodes.items():
        if node.running and node.paused:
            cluster.resume(node_id)
    dead = [n for n, node in cluster.nodes.items() if not node.running]
    if dead and start_dead:
        cluster.start(dead)
        history.record({"type": "nemesis", "phase": "info",
                        "detail": f"final heal: started nodes {dead}"})


def _wait_full_isr(target: nemesis.Target) -> None:
    wait_until(lambda: nemesis.whole_isr(target), FULL_ISR_S,
               f"every partition of {TOPIC} with its whole ISR", interval_s=0.2)


def _create_topic(cluster: ProcessCluster, config: RunConfig, settings: dict,
                  security: ClientSecurity) -> None:
    from api.client import Admin, NewTopic

    replication = settings["default.replication.factor"]
    configs = {"min.insync.replicas": str(settings["min.insync.replicas"])}
    if config.unsafe_ack_before_replication:
        configs["unclean.leader.election.enable"] = "true"
    names = [TOPIC] + ([f"{TOPIC}-copy"] if config.workload == "transactional" else [])
    with Admin(_broker_urls(cluster), **security.settings) as admin:
        admin.create_topics([NewTopic(name, config.partitions, replication, configs=configs)
                             for name in names])
    target = nemesis.Target(cluster, TOPIC, config.partitions, random.Random(0))
    _wait_full_isr(target)


def _broker_urls(cluster: ProcessCluster) -> list[str]:
    return [cluster.nodes[b].broker_url for b in cluster.broker_ids]


def _not_run(config: RunConfig, reason: str, say: Callable[[str], None]) -> dict[str, Any]:
    say(f"NOT RUN: {reason}")
    results = {"scenario": config.scenario, "seed": config.seed,
               "duration_s": config.duration_s, "verdict": "not-run", "reason": reason,
               "config": _jsonable(asdict(config))}
    write_results(config.out_dir, results, [], say)
    return results


def write_results(out_dir: str, results: dict, events: list[dict],
                   say: Callable[[str], None]) -> None:
    """results.json, then report.html (a report that fails to render is
    said, and leaves the verdict alone)."""
    from chaos import report

    path = os.path.join(out_dir, "results.json")
    with open(path + ".tmp", "w") as f:
        json.dump(results, f, indent=2)
        f.write("\n")
    os.replace(path + ".tmp", path)
    try:
        report.write_report(out_dir, events, results)
    except Exception as exc:  # noqa: BLE001  the verdict stands without the page
        say(f"warning: report.html could not be written: {type(exc).__name__}: {exc}")


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def exit_status(results: dict) -> int:
    return {"pass": EXIT_PASS, "not-run": EXIT_NOT_RUN, "unknown": EXIT_UNKNOWN}.get(
        results.get("verdict"), EXIT_FAIL)


def summary(results: dict, out_dir: str) -> str:
    """The verdict for people: a table of anomalies and counts."""
    from api.table import format_table

    lines = []
    verdict = results.get("verdict", "fail").upper()
    reason = results.get("reason")
    lines.append(f"{verdict}: {results.get('scenario')} seed {results.get('seed')}"
                 + (f" — {reason}" if reason else ""))
    if results.get("unsafe_ack_before_replication"):
        lines.append("(a deliberately BROKEN cluster: unsafe.ack.before.replication was on)")
    counts = results.get("counts")
    if counts:
        lines.append(
            f"writes: {counts['attempted']:,} attempted, {counts['ok']:,} ok, "
            f"{counts['failed']:,} failed, {counts['unknown']:,} unknown "
            f"({counts['recovered_unknown']:,} of them found in the log); "
            f"{counts['final_records']:,} records in the final read, "
            f"{counts['read']:,} read live")
    anomalies = results.get("anomalies")
    if anomalies:
        rows = [(kind, f"{a['count']:,}", "yes" if kind in results.get("failing", ()) else "no")
                for kind, a in anomalies.items()]
        lines.append(format_table(("Anomaly", "Count", "Fails the run"), rows))
    faults = results.get("faults")
    if faults is not None:
        lines.append(f"faults: {len(faults)} injected and healed")
    latency = results.get("latency_ms") or {}
    if latency:
        lines.append(f"acks=all latency p50 {latency['p50']} ms, p99 {latency['p99']} ms, "
                     f"max {latency['max']} ms; {results.get('unavailable_s')} s without an "
                     "acknowledged write")
    processes = results.get("resources") or []
    judged = [p for p in processes if p.get("judged")]
    if judged:
        def span(p: dict, key: str, scale: int = 1) -> str:
            bound = p.get(key + "_bound")
            return (f"{p[key + '_early'] // scale:,} -> {p[key + '_end'] // scale:,}"
                    + (f" (<= {bound // scale:,})" if bound is not None else ""))
        rows = [(p["node"], p["pid"], f"{p['span_s']:g}", span(p, "rss_kb", 1024),
                 span(p, "other_fds"), span(p, "segments_open"),
                 p.get("deleted_open_end", "-")) for p in judged]
        lines.append(format_table(("Node", "Pid", "Lived s", "RSS MiB", "Other fds",
                                   "Open segments", "Deleted held"), rows))
    elif processes:
        lines.append(f"resources: {len(processes)} node processes sampled, none lived long "
                     "enough to judge growth (a soak does)")
    lines.append(f"report: {os.path.join(out_dir, 'report.html')}")
    return "\n".join(lines)


def main_say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
