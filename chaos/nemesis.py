"""Nemeses: the faults a chaos run injects, and the scenarios that pick them.

A nemesis looks at the cluster as a user would (the brokers' ``/v1/metadata``
and the controllers' ``/v1/quorum``), chooses its targets with the run's
seeded random generator, injects its fault, and returns an ``ActiveFault``
whose ``heal`` undoes it: restart what it killed, resume what it paused,
remove the network cuts it made. The runner holds each fault for a seeded
while and then heals it; at the end of a run every fault is healed before the
final read, whatever happened.

Faults, by name (``NEMESES``):

``kill-leader``         kill -9 the leader of a random partition
``kill-random``         kill -9 a random broker
``kill-two``            kill -9 two of the three brokers (N-1 with RF=3)
``kill-controller``     kill -9 the active controller
``restart-cluster``     kill -9 every node at once, then start them all
``pause``               SIGSTOP a partition leader or the active controller,
                        SIGCONT on heal
``pause-kill``          SIGSTOP both followers of a partition's leader, let
                        writes arrive for a second, kill -9 the leader,
                        SIGCONT the followers: acknowledged writes now exist
                        only if the leader waited for its followers
``rolling-restart``     SIGTERM each node in turn, waiting for it to serve
                        again before the next (a deploy)
``partition-leader``    cut a partition leader off from every other node
                        (clients still reach it)
``partition-controller`` cut the active controller off from the other
                        controllers (a quorum split, one against two)
``partition-halves``    split the nodes into two sides, two controllers on
                        the majority side and one on the minority, the
                        brokers spread between them
``clock``               step a random node's wall clock forward or backward
                        (minutes to ten days: past retention.ms and
                        producer.id.expiration.ms) through ``chaos.faultyio``,
                        preloaded into every node; heal steps it back
``controller-membership`` remove a random controller voter (the active one
                        or another) with the API ``kraftlog quorum
                        remove-controller`` uses, while, as often as not,
                        another controller is killed with -9 or stopped
                        with SIGSTOP in the middle of the change. Heal:
                        the other controller back, then the removed one
                        added back (``add-controller``); one that never
                        heard of its removal (its leader died first) is
                        stopped, its metadata dir cleared and it is
                        started to join, as docs/quorum.md tells users
``disk``                give a random broker's second log dir EIO on write,
                        read or fsync, or ENOSPC (``chaos.faultyio``,
                        preloaded into every broker); it takes the dir
                        offline and the controller moves its replicas'
                        leadership away. Heal: the disk made healthy and the
                        broker restarted (SIGTERM), which brings the dir back
``power``               a machine crash of a random broker: kill -9, then
                        every file in its log dirs cut back to what it had
                        at its last fsync (``chaos.faultyio.lose_unsynced``,
                        from the syncs its preloaded library journalled),
                        and a new boot id, as after power comes back. Heal:
                        start it
``power-all``           the same for every broker at once (a rack losing
                        power; the controllers stay up)

Partition nemeses need ``chaos.netns``; scenarios that use them are not run
(and say why) where namespaces are unavailable.

Against a TLS cluster every probe goes through the cluster's own methods or
its ``ssl_context`` (the CA and the client certificate of the run).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from api.cli_support import CliError, at_active_controller
from chaos import faultyio
from chaos.cluster import ProcessCluster, http_json, wait_until

#: How long ``pause-kill`` lets writes reach the leader while its followers
#: are stopped (shorter than the session timeout, so they are not fenced).
PAUSE_KILL_WRITE_WINDOW_S = 1.0
#: How long a rolling restart waits for one node to serve again.
ROLLING_NODE_WAIT_S = 30.0
#: A controller this many Raft entries behind the leader counts as caught up.
CONTROLLER_LAG_MAX = 5
#: Each metadata probe of a broker waits at most this long.
PROBE_TIMEOUT_S = 2.0


@dataclass
class ActiveFault:
    name: str
    targets: list[int]
    detail: str
    heal: Callable[[], None]
    #: False for faults that are over when they return (a rolling restart):
    #: the runner does not hold them.
    hold: bool = True


@dataclass
class Target:
    """What a nemesis acts on."""

    cluster: ProcessCluster
    topic: str
    partitions: int
    rng: random.Random
    network: Any = None  # chaos.netns.Network, when nodes run in namespaces
    log: Callable[[str], None] = lambda line: None
    #: Nodes each fault has killed and not yet restarted, and paused nodes.
    killed: set[int] = field(default_factory=set)
    paused: set[int] = field(default_factory=set)
    #: Per broker, the log dir the ``disk`` nemesis can fail (its brokers
    #: run with two log dirs and ``faultyio`` preloaded); empty without it.
    disks: dict[int, faultyio.FaultyDir] = field(default_factory=dict)
    #: Per node, the control of its ``faultyio`` (the ``clock`` nemesis
    #: steps its wall clock); empty without it.
    clocks: dict[int, faultyio.FaultyDir] = field(default_factory=dict)
    #: Whether the ``clock`` nemesis has stepped a clock forward past
    #: retention.ms yet (its first step does).
    clock_stepped_far: bool = False
    #: Per broker, the sync journal of its ``faultyio`` (the ``power``
    #: nemeses cut its files back to it); empty without them.
    syncs: dict[int, str] = field(default_factory=dict)


# -- observation -------------------------------------------------------------------
def partition_states(target: Target) -> dict[int, dict]:
    """partition -> {leader, leader_epoch, isr, replicas}, as the broker with
    the newest metadata (highest ``metadata_offset``) among those that answer
    sees it: a cut-off or lagging broker may still think itself leader."""
    newest: tuple[int, dict] | None = None
    cluster = target.cluster
    for broker in cluster.broker_ids:
        node = cluster.nodes[broker]
        if not node.running or node.paused:
            continue
        try:
            status, body = http_json(f"{node.broker_url}/v1/metadata?topics={target.topic}",
                                     timeout_s=PROBE_TIMEOUT_S, context=cluster.ssl_context)
        except (OSError, ValueError):
            continue
        if status == 200 and (newest is None or body.get("metadata_offset", -1) > newest[0]):
            newest = (body.get("metadata_offset", -1), body)
    if newest is None:
        return {}
    return {state["partition"]: state for topic in newest[1].get("topics", [])
            for state in topic.get("partitions", [])}


def live_leader(target: Target, partition: int) -> int | None:
    state = partition_states(target).get(partition)
    leader = state.get("leader") if state else None
    if leader is None or leader < 0:
        return None
    node = target.cluster.nodes.get(leader)
    return leader if node is not None and node.running and not node.paused else None


def running_brokers(target: Target) -> list[int]:
    return [b for b in target.cluster.broker_ids
            if target.cluster.nodes[b].running and not target.cluster.nodes[b].paused]


def whole_isr(target: Target) -> bool:
    """Every partition has a leader and all its replicas in the ISR."""
    states = partition_states(target)
    return len(states) == target.partitions and all(
        len(s.get("isr", [])) == len(s.get("replicas", [])) and s.get("leader", -1) >= 0
        for s in states.values())


def controller_caught_up(cluster: ProcessCluster, node_id: int) -> bool:
    """The quorum leader sees ``node_id`` connected and within
    ``CONTROLLER_LAG_MAX`` entries of its log (or ``node_id`` leads)."""
    status = cluster.quorum(node_id)
    leader = status.get("leader_id") if status else None
    if leader is None:
        return False
    if leader == node_id:
        return True
    leader_status = cluster.quorum(leader)
    for voter in (leader_status or {}).get("voters", []):
        if voter["id"] == node_id:
            return bool(voter.get("connected")) and voter.get("lag") is not None \
                and voter["lag"] <= CONTROLLER_LAG_MAX
    return False


def wait_serving(cluster: ProcessCluster, node_ids: list[int], timeout_s: float) -> None:
    """Until each broker among ``node_ids`` says it is running and, if any of
    them is a controller, some controller is active."""
    brokers = [n for n in node_ids if n in cluster.broker_ids]
    if brokers:
        cluster.wait_for_brokers_running(brokers, timeout_s)
    if any(n in cluster.controller_ids for n in node_ids):
        cluster.wait_for_active_controller(timeout_s)


# -- process faults ------------------------------------------------------------------
def _restart(target: Target, node_ids: list[int]) -> Callable[[], None]:
    def heal() -> None:
        dead = [n for n in node_ids if not target.cluster.nodes[n].running]
        if dead:
            target.cluster.start(dead)
        target.killed.difference_update(node_ids)
    return heal


def _kill(target: Target, node_ids: list[int]) -> None:
    for node_id in node_ids:
        target.cluster.kill(node_id, signal.SIGKILL)
        target.killed.add(node_id)
        target.paused.discard(node_id)


def kill_leader(target: Target) -> ActiveFault | None:
    partition = target.rng.randrange(target.partitions)
    leader = live_leader(target, partition)
    if leader is None:
        return None
    _kill(target, [leader])
    return ActiveFault("kill-leader", [leader],
                       f"kill -9 broker {leader}, leader of {target.topic}-{partition}",
                       _restart(target, [leader]))


def kill_random(target: Target) -> ActiveFault | None:
    brokers = running_brokers(target)
    if not brokers:
        return None
    victim = target.rng.choice(brokers)
    _kill(target, [victim])
    return ActiveFault("kill-random", [victim], f"kill -9 broker {victim}",
                       _restart(target, [victim]))


def kill_two(target: Target) -> ActiveFault | None:
    brokers = running_brokers(target)
    if len(brokers) < 2:
        return None
    victims = sorted(target.rng.sample(brokers, 2))
    _kill(target, victims)
    return ActiveFault("kill-two", victims,
                       f"kill -9 brokers {victims[0]} and {victims[1]} (two of "
                       f"{len(target.cluster.broker_ids)})", _restart(target, victims))


def kill_controller(target: Target) -> ActiveFault | None:
    active = target.cluster.active_controller()
    if active is None:
        return None
    _kill(target, [active])
    return ActiveFault("kill-controller", [active], f"kill -9 active controller {active}",
                       _restart(target, [active]))


def restart_cluster(target: Target) -> ActiveFault | None:
    everyone = sorted(target.cluster.nodes)
    _kill(target, everyone)
    return ActiveFault("restart-cluster", everyone, "kill -9 every node at once",
                       _restart(target, everyone))


def _pause(target: Target, node_ids: list[int]) -> None:
    for node_id in node_ids:
        target.cluster.pause(node_id)
        target.paused.add(node_id)


def _resume(target: Target, node_ids: list[int]) -> Callable[[], None]:
    def heal() -> None:
        for node_id in node_ids:
            node = target.cluster.nodes[node_id]
            if node.running and node.paused:
                target.cluster.resume(node_id)
            target.paused.discard(node_id)
    return heal


def pause(target: Target) -> ActiveFault | None:
    if target.rng.random() < 1 / 3:
        victim = target.cluster.active_controller()
        what = "active controller"
    else:
        partition = target.rng.randrange(target.partitions)
        victim = live_leader(target, partition)
        what = f"broker, leader of {target.topic}-{partition}"
    if victim is None:
        return None
    _pause(target, [victim])
    return ActiveFault("pause", [victim], f"SIGSTOP node {victim} ({what})",
                       _resume(target, [victim]))


def pause_kill(target: Target) -> ActiveFault | None:
    partition = target.rng.randrange(target.partitions)
    state = partition_states(target).get(partition)
    leader = live_leader(target, partition)
    if state is None or leader is None:
        return None
    followers = [r for r in state.get("replicas", []) if r != leader
                 and target.cluster.nodes[r].running and not target.cluster.nodes[r].paused]
    if not followers:
        return None
    _pause(target, followers)
    time.sleep(PAUSE_KILL_WRITE_WINDOW_S)
    _kill(target, [leader])
    _resume(target, followers)()
    return ActiveFault("pause-kill", [leader, *followers],
                       f"SIGSTOP followers {followers} of {target.topic}-{partition}, "
                       f"{PAUSE_KILL_WRITE_WINDOW_S:g} s of writes, kill -9 leader {leader}, "
                       "SIGCONT the followers", _restart(target, [leader]))


def rolling_restart(target: Target) -> ActiveFault | None:
    cluster = target.cluster
    order = ([b for b in cluster.broker_ids if b not in cluster.controller_ids]
             + cluster.controller_ids)
    for node_id in order:
        node = cluster.nodes[node_id]
        if not node.running or node.paused:
            continue
        target.log(f"rolling restart: SIGTERM node {node_id}")
        _stop_gracefully(target, node_id, ROLLING_NODE_WAIT_S)
        cluster.start([node_id])
        wait_serving(cluster, [node_id], ROLLING_NODE_WAIT_S)
        if node_id in cluster.controller_ids:
            # The next controller only once this one follows the leader
            # closely again: two voters catching up at once is a lost quorum.
            wait_until(lambda: controller_caught_up(cluster, node_id), ROLLING_NODE_WAIT_S,
                       f"controller {node_id} caught up with the quorum leader",
                       interval_s=0.1)
        if node_id in cluster.broker_ids:
            # As an operator would: the next broker only once nothing is
            # under-replicated.
            wait_until(lambda: whole_isr(target), ROLLING_NODE_WAIT_S,
                       f"every partition of {target.topic} with its whole ISR after "
                       f"restarting broker {node_id}", interval_s=0.2)
    return ActiveFault("rolling-restart", order,
                       f"SIGTERM and restart nodes {order} one at a time",
                       _restart(target, order), hold=False)


# -- disk faults ---------------------------------------------------------------------
#: The disk faults the ``disk`` nemesis picks from.
DISK_FAULTS = ("write", "enospc", "fsync", "read")
#: How long a broker restarted after a disk fault may take to stop and serve again.
DISK_RESTART_WAIT_S = 30.0


def disk(target: Target) -> ActiveFault | None:
    brokers = [b for b in running_brokers(target) if b in target.disks]
    if not brokers:
        return None
    victim = target.rng.choice(brokers)
    fault = target.rng.choice(DISK_FAULTS)
    faulty = target.disks[victim]
    faulty.inject(fault)
    error = "ENOSPC on write" if fault == "enospc" else f"EIO on {fault}"
    return ActiveFault("disk", [victim],
                       f"{error} in broker {victim}'s log dir {faulty.directory}",
                       _heal_disk(target, victim))


def _heal_disk(target: Target, broker: int) -> Callable[[], None]:
    """The disk healthy again, then the broker restarted (gracefully, as an
    operator would after replacing it): only a new process brings an
    offline log dir back."""
    def heal() -> None:
        offline = _offline_log_dirs(target, broker)
        target.log(f"broker {broker} reports log dirs offline: {offline}"
                   if offline else f"broker {broker} reports no log dir offline (the fault "
                   "met no I/O, or the broker is unreachable)")
        target.disks[broker].clear()
        cluster = target.cluster
        node = cluster.nodes[broker]
        if node.running and not node.paused:
            _stop_gracefully(target, broker, DISK_RESTART_WAIT_S)
        if not node.running and broker not in target.killed:
            cluster.start([broker])
            wait_serving(cluster, [broker], DISK_RESTART_WAIT_S)
    return heal


def _offline_log_dirs(target: Target, broker: int) -> list[str] | None:
    """The log dirs the metadata says ``broker`` took offline, as the first
    running broker that answers tells it (None: none answered)."""
    cluster = target.cluster
    for other in running_brokers(target):
        try:
            status, body = http_json(f"{cluster.nodes[other].broker_url}/v1/brokers",
                                     timeout_s=PROBE_TIMEOUT_S, context=cluster.ssl_context)
        except (OSError, ValueError):
            continue
        for entry in body.get("brokers", ()) if status == 200 else ():
            if entry.get("id") == broker:
                return entry.get("offline_log_dirs", [])
    return None


# -- power loss ----------------------------------------------------------------------
def power(target: Target) -> ActiveFault | None:
    brokers = [b for b in running_brokers(target) if b in target.syncs
               and b not in target.cluster.controller_ids]
    if not brokers:
        return None
    victim = target.rng.choice(brokers)
    return _power_loss(target, "power", [victim])


def power_all(target: Target) -> ActiveFault | None:
    brokers = [b for b in target.cluster.broker_ids if b in target.syncs
               and b not in target.cluster.controller_ids]
    if not brokers or any(not target.cluster.nodes[b].running for b in brokers):
        return None
    return _power_loss(target, "power-all", brokers)


def _power_loss(target: Target, name: str, brokers: list[int]) -> ActiveFault:
    """kill -9 ``brokers`` at once, then, for each, what its machine's power
    loss would leave on disk: files cut back to their last fsync, and a boot
    id of another boot recorded in its log dirs (the broker takes that as a
    machine crash: it may have lost unflushed data)."""
    _kill(target, brokers)
    lost = []
    for broker in brokers:
        dirs = target.cluster.log_dirs_of(broker)
        loss = faultyio.lose_unsynced(dirs, target.syncs[broker])
        for directory in dirs:
            _another_boot(os.path.join(directory, BOOT_ID_FILE))
        lost.append(f"broker {broker} lost {loss.bytes:,} unsynced bytes of {loss.files} files")
        for path, before, after in loss.cuts[:POWER_CUTS_LOGGED]:
            target.log(f"power loss: {path} cut from {before:,} to {after:,} bytes")
    return ActiveFault(name, brokers, f"power loss (kill -9, unsynced writes dropped, new boot) "
                       f"of broker{'s' if len(brokers) > 1 else ''} "
                       f"{', '.join(map(str, brokers))}: {'; '.join(lost)}",
                       _restart(target, brokers))


#: The file in each log dir where a broker records the boot it started in
#: (docs/durability.md): another boot there means its machine crashed.
BOOT_ID_FILE = ".kraftlog_boot_id"
#: How many of one power loss's cut files the history names.
POWER_CUTS_LOGGED = 20


def _another_boot(path: str) -> None:
    """The boot id a log dir recorded (first line), replaced by one no boot
    had, as if the machine had booted since; a missing or empty record is
    left as it is (the broker counts that as a loss already)."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
    except FileNotFoundError:
        return
    if not lines or not lines[0]:
        return
    lines[0] = f"power-loss-{os.urandom(8).hex()}"
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))


# -- clock faults --------------------------------------------------------------------
#: How far the ``clock`` nemesis steps a wall clock (ms): a few minutes, an
#: hour, past producer.id.expiration.ms (a day), past retention.ms (a week).
CLOCK_STEPS_MS = (5 * 60_000, 3_600_000, 2 * 86_400_000, 10 * 86_400_000)


def clock(target: Target) -> ActiveFault | None:
    nodes = [n for n in sorted(target.clocks) if target.cluster.nodes[n].running
             and not target.cluster.nodes[n].paused]
    if not nodes:
        return None
    victim = target.rng.choice(nodes)
    step_ms = target.rng.choice(CLOCK_STEPS_MS) * target.rng.choice((1, -1))
    if not target.clock_stepped_far:
        # The step that would delete retained data on a node that trusted
        # its system clock comes first, so even a short run can fail.
        step_ms = max(CLOCK_STEPS_MS)
        target.clock_stepped_far = True
    target.clocks[victim].shift_clock(step_ms)
    direction = "forward" if step_ms > 0 else "backward"
    return ActiveFault("clock", [victim],
                       f"step node {victim}'s wall clock {direction} by {_span(abs(step_ms))}",
                       _heal_clock(target, victim))


def _span(ms: int) -> str:
    for unit, size in (("days", 86_400_000), ("h", 3_600_000), ("min", 60_000)):
        if ms >= size:
            return f"{ms / size:g} {unit}"
    return f"{ms} ms"


def _heal_clock(target: Target, node_id: int) -> Callable[[], None]:
    def heal() -> None:
        target.clocks[node_id].shift_clock(0)
    return heal


def _stop_gracefully(target: Target, node_id: int, wait_s: float) -> None:
    """SIGTERM, and wait up to ``wait_s`` for the node to stop. One that
    does not is a finding, not a harness failure: its thread stacks go into
    its log, the history says so, and it is killed with SIGKILL."""
    cluster = target.cluster
    node = cluster.nodes[node_id]
    try:
        cluster.kill(node_id, signal.SIGTERM, timeout_s=wait_s)
    except subprocess.TimeoutExpired:
        node.process.send_signal(signal.SIGUSR1)
        time.sleep(0.5)
        cluster.kill(node_id, signal.SIGKILL)
        target.log(f"SLOW STOP: node {node_id} did not stop within {wait_s:g} s of SIGTERM; "
                   f"its thread stacks are in {node.log_path}; killed with SIGKILL")


# -- controller membership ---------------------------------------------------------
#: How long a voter change may take (the CLI's own bound, and its catch-up).
VOTER_CHANGE_WAIT_S = 30.0
#: How long the heal waits for the quorum to settle after the change.
QUORUM_SETTLE_S = 60.0
#: What happens to another controller while a voter is being removed.
MEMBERSHIP_DISTURBANCES = ("nothing", "kill", "pause")


def voter_set(cluster: ProcessCluster) -> tuple[int | None, list[int] | None, bool]:
    """(active controller, its voter ids, whether a voter change is still
    uncommitted), as the active controller says; (None, None, False) when
    no controller is active."""
    active = cluster.active_controller()
    status = cluster.quorum(active) if active is not None else None
    if status is None:
        return None, None, False
    return (active, sorted(v["id"] for v in status.get("voters", [])),
            status.get("pending_voter_change") is not None)


def voter_call(cluster: ProcessCluster, path: str, body: dict, timeout_s: float
               ) -> tuple[bool, str]:
    """POST a voter change to the active controller as ``kraftlog quorum``
    does (``at_active_controller``: following NOT_CONTROLLER hints), from
    the running controllers, waiting out a change in flight, until
    ``timeout_s``. (True, voters) or (False, the last refusal or error)."""
    nodes = {cluster.nodes[c].controller_url: cluster.nodes[c] for c in cluster.controller_ids}

    def post(url: str, body: dict, timeout: float) -> object:
        try:
            status, answer = http_json(url, body, timeout_s=timeout, context=cluster.ssl_context)
        except (OSError, ValueError) as exc:
            raise CliError(f"{url}: {exc}") from exc
        if status != 200 and not (isinstance(answer, dict) and answer.get("error")):
            return {"error": {"code": f"HTTP {status}", "message": str(answer)}}
        return answer

    def down(url: str) -> bool:
        node = nodes.get(url)
        return node is not None and (not node.running or node.paused)

    try:
        answer = at_active_controller(list(nodes), path, body, timeout_s, post,
                                      wait_on=("REBALANCE_IN_PROGRESS",), skip=down)
    except CliError as exc:
        return False, str(exc)
    return True, str(sorted(v["id"] for v in answer.get("voters", [])))


def controller_membership(target: Target) -> ActiveFault | None:
    cluster = target.cluster
    active, voters, pending = voter_set(cluster)
    if active is None or pending or voters != cluster.controller_ids \
            or len(voters) < 2 or target.killed or target.paused:
        return None  # only from a whole, quiet quorum
    victim = target.rng.choice(voters)
    disturbance = target.rng.choice(MEMBERSHIP_DISTURBANCES)
    bystander = target.rng.choice([c for c in voters if c != victim]) \
        if disturbance != "nothing" else None
    outcome: list[tuple[bool, str]] = []
    change = threading.Thread(target=lambda: outcome.append(voter_call(
        cluster, "/v1/controller/quorum/remove-voter", {"node_id": victim},
        VOTER_CHANGE_WAIT_S)), daemon=True)
    change.start()
    if bystander is not None:
        time.sleep(target.rng.uniform(0.0, 0.3))  # somewhere inside the change
        (_kill if disturbance == "kill" else _pause)(target, [bystander])
    change.join(VOTER_CHANGE_WAIT_S + 5)
    ok, said = outcome[0] if outcome else (False, "no answer yet")
    during = "" if bystander is None else \
        f", {'kill -9' if disturbance == 'kill' else 'SIGSTOP'} controller {bystander} meanwhile"
    return ActiveFault("controller-membership", [victim] + ([bystander] if bystander else []),
                       f"remove controller {victim} from voters {voters} (active: {active})"
                       f"{during}: " + (f"voters now {said}" if ok else f"not done: {said}"),
                       _heal_membership(target, victim, bystander, change))


def _heal_membership(target: Target, victim: int, bystander: int | None,
                     change: threading.Thread | None = None) -> Callable[[], None]:
    cluster = target.cluster

    def settled() -> list[int]:
        """The voters once an active controller has no change pending."""
        def ask() -> list[int] | None:
            active, voters, pending = voter_set(cluster)
            return None if active is None or pending else voters
        return wait_until(ask, QUORUM_SETTLE_S, "an active controller with no voter change "
                          "pending")

    def add() -> tuple[bool, str]:
        node = cluster.nodes[victim]
        return voter_call(cluster, "/v1/controller/quorum/add-voter", {
            "node_id": victim, "address": f"{node.host}:{node.controller_port}",
            "timeout_ms": int(VOTER_CHANGE_WAIT_S * 1000)}, VOTER_CHANGE_WAIT_S + 10)

    def heal() -> None:
        if bystander is not None:
            _restart(target, [bystander])()
            _resume(target, [bystander])()
        if change is not None:
            change.join(VOTER_CHANGE_WAIT_S + 5)  # the removal's own retries are over
        if victim in settled():
            return _all_name_every_voter(cluster)
        ok, said = add()
        if not ok and victim not in settled():
            # It never heard of its removal (its leader died first): as
            # docs/quorum.md says, stop it, clear its metadata, and start it
            # to join with the current voters in its config.
            target.log(f"controller {victim} not added back as it is ({said}): "
                       "clearing its metadata and starting it to join")
            if cluster.nodes[victim].running:
                _stop_gracefully(target, victim, ROLLING_NODE_WAIT_S)
            shutil.rmtree(cluster.metadata_dir_of(victim), ignore_errors=True)
            cluster.rewrite_config(victim, joining_voters=settled())
            cluster.start([victim])
            wait_until(lambda: cluster.quorum(victim) is not None, QUORUM_SETTLE_S,
                       f"controller {victim} listening again")
            ok, said = add()
            if not ok and victim not in settled():
                raise RuntimeError(f"controller {victim} could not be added back: {said}")
        target.log(f"controller {victim} added back: voters {settled()}")
        _all_name_every_voter(cluster)
    return heal


def _all_name_every_voter(cluster: ProcessCluster) -> None:
    wait_until(lambda: all((status := cluster.quorum(c)) is not None and sorted(
            v["id"] for v in status.get("voters", [])) == cluster.controller_ids
            for c in cluster.controller_ids), QUORUM_SETTLE_S,
            f"every controller naming voters {cluster.controller_ids}")


# -- network faults ------------------------------------------------------------------
def _heal_network(target: Target) -> Callable[[], None]:
    return target.network.heal


def partition_leader(target: Target) -> ActiveFault | None:
    partition = target.rng.randrange(target.partitions)
    leader = live_leader(target, partition)
    if leader is None:
        return None
    others = set(target.cluster.nodes) - {leader}
    target.network.isolate(leader, others)
    return ActiveFault("partition-leader", [leader],
                       f"cut broker {leader} (leader of {target.topic}-{partition}) off from "
                       f"nodes {sorted(others)}; clients still reach it",
                       _heal_network(target))


def partition_controller(target: Target) -> ActiveFault | None:
    active = target.cluster.active_controller()
    if active is None:
        return None
    others = set(target.cluster.controller_ids) - {active}
    target.network.isolate(active, others)
    return ActiveFault("partition-controller", [active],
                       f"cut active controller {active} off from controllers {sorted(others)}",
                       _heal_network(target))


def partition_halves(target: Target) -> ActiveFault | None:
    cluster = target.cluster
    controllers = list(cluster.controller_ids)
    target.rng.shuffle(controllers)
    minority_size = (len(controllers) - 1) // 2
    minority, majority = set(controllers[:minority_size]), set(controllers[minority_size:])
    for broker in cluster.broker_ids:
        if broker in cluster.controller_ids:
            continue
        (minority if target.rng.random() < 0.5 else majority).add(broker)
    target.network.partition([minority, majority])
    quorum = set(cluster.controller_ids)
    return ActiveFault("partition-halves", sorted(minority),
                       f"split nodes: minority side {sorted(minority)} (controllers "
                       f"{sorted(minority & quorum)}) | majority side {sorted(majority)} "
                       f"(controllers {sorted(majority & quorum)})",
                       _heal_network(target))


NEMESES: dict[str, Callable[[Target], ActiveFault | None]] = {
    "kill-leader": kill_leader,
    "kill-random": kill_random,
    "kill-two": kill_two,
    "kill-controller": kill_controller,
    "restart-cluster": restart_cluster,
    "pause": pause,
    "pause-kill": pause_kill,
    "rolling-restart": rolling_restart,
    "partition-leader": partition_leader,
    "partition-controller": partition_controller,
    "partition-halves": partition_halves,
    "disk": disk,
    "clock": clock,
    "power": power,
    "power-all": power_all,
    "controller-membership": controller_membership,
}
NETWORK_NEMESES = frozenset({"partition-leader", "partition-controller", "partition-halves"})


@dataclass(frozen=True)
class Scenario:
    name: str
    nemeses: tuple[str, ...]
    proves: str
    #: The fault a run injects first, so that even a short run shows it.
    first: str | None = None

    @property
    def needs_network(self) -> bool:
        return all(n in NETWORK_NEMESES for n in self.nemeses)


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("kill-leader", ("kill-leader",),
             "a partition leader's crash loses no acknowledged write: the new leader "
             "comes from the ISR, which holds every committed record"),
    Scenario("kill-random", ("kill-random",),
             "any one broker's crash, leader or follower, loses nothing"),
    Scenario("kill-two", ("kill-two",),
             "N-1 with RF=3: with two of three brokers dead, writes are refused "
             "(min.insync.replicas=2) and nothing acknowledged is lost"),
    Scenario("kill-controller", ("kill-controller",),
             "the active controller's crash moves control to another voter without "
             "losing metadata, and the data plane keeps its guarantees"),
    Scenario("restart-cluster", ("restart-cluster",),
             "every node crashing at once loses nothing acknowledged: logs, high "
             "watermarks and metadata recover from disk"),
    Scenario("pause", ("pause",),
             "a stopped (not dead) leader or controller is fenced; when it wakes it "
             "cannot acknowledge or serve anything the cluster moved past"),
    Scenario("pause-kill", ("pause-kill",),
             "writes that reached only the leader are never acknowledged: run with "
             "--unsafe-ack-before-replication to watch the checker catch the loss"),
    Scenario("rolling-restart", ("rolling-restart",),
             "a deploy (SIGTERM, restart, one node at a time) loses nothing"),
    Scenario("partition", ("partition-leader", "partition-controller", "partition-halves"),
             "network partitions (an isolated leader, a controller quorum split, a "
             "majority/minority split) lose nothing and never give two leaders "
             "acknowledging writes for one partition"),
    Scenario("disk", ("disk",),
             "a disk error (EIO on write, read or fsync, or ENOSPC) in one log dir of a "
             "broker takes that dir offline: its partitions are led elsewhere and "
             "nothing acknowledged is lost; a restart with the disk healthy brings it back"),
    Scenario("clock", ("clock",),
             "a node's wall clock stepped forward or backward (up to ten days, past "
             "retention.ms and producer.id.expiration.ms) deletes nothing early, "
             "loses nothing and holds no lease past its time: nodes act on the clock "
             "they started with, moved on by the monotonic clock"),
    Scenario("power", ("power",),
             "a machine crash of one broker (everything it wrote since its last fsync "
             "gone, a new boot) loses nothing acknowledged with acks=all: the others in "
             "the ISR hold it, and the broker that lost its tail leads nothing until it "
             "has caught up (KIP-903, KIP-966)"),
    Scenario("power-all", ("power-all",),
             "every broker losing power at once loses nothing acknowledged with acks=all "
             "when topics fsync each append (flush.messages=1, which this scenario sets "
             "unless --set gives log.flush.interval.messages); with the background "
             "flush alone it may lose writes, and the checker shows it"),
    Scenario("membership", ("controller-membership", "kill-controller", "pause"),
             "controller voters removed and added back on a live cluster (KIP-853), "
             "with a controller killed or stopped in the middle of a change and "
             "controller and leader faults between changes: the metadata and the data "
             "lose nothing, and every change ends committed everywhere or nowhere",
             first="controller-membership"),
    Scenario("mixed", tuple(n for n in NEMESES if n not in ("pause-kill", "power-all")),
             "any of the faults above, in a seeded random order"),
)}
