"""Cluster nodes in their own network namespaces, so links between them can be cut.

Why: on loopback every node shares one network stack, so the only failures a
chaos harness can cause are process failures (kill, pause). Real clusters
also lose links: a broker that the controller cannot hear while clients still
can, a minority cut off from the majority. To cause that, each node gets its
own network stack (a Linux network namespace) joined to the others by a
private bridge, and a cut is a rule in a namespace that silently drops the
packets to one peer. Silently matters: a refused connection is quick and
clear, while a dropped packet leaves the sender waiting for a timeout, which
is what a real partition does to a node.

How it is laid out (``Network.setup``), all through iproute2 (``ip``, ``tc``)::

    root namespace (the harness)
      bridge klb<pid>-<n>, address 10.213.K.1/24      <- Network.host_address
        |-- veth klv<pid>-<n>-<node> ==== eth0 in namespace kraftlog-<pid>-<n>-node<id>,
        |                                 address 10.213.K.(10 + id)/24, lo up,
        |                                 default route via 10.213.K.1
        `-- ... one veth pair per node

The harness runs a node's process inside its namespace with
``Network.wrap(node_id, argv)`` (``ip netns exec``, which execs the command,
so the pid the harness gets is the node's). The harness itself stays in the
root namespace and reaches every node through the bridge at all times: cuts
only ever name node addresses, never the bridge's.

How a cut works (``partition``, ``isolate``, ``heal``): a cut between A and B
drops A->B in A's namespace and B->A in B's namespace, on the egress of the
namespace's ``eth0``, with tc:

* root qdisc ``htb`` with no default class: packets no filter classifies go
  through htb's direct queue, unshaped, so uncut traffic is untouched;
* one class ``1:1`` whose leaf qdisc is ``pfifo limit 0``: a queue that holds
  nothing, so every packet sent to it is dropped;
* one ``u32`` filter per cut peer, ``match ip dst <peer>/32 flowid 1:1``, at
  filter priority ``1 + peer id`` so a single cut can be removed on its own.

The usual recipe, a ``prio`` qdisc and ``u32 ... action drop``, needs the
``sch_prio`` and ``act_gact`` kernel modules; kernels built without them (the
microVM this was written on has neither, and no module directory) reject it.
The recipe here needs only u32 (which the usual one needs too), htb and
pfifo, which nearly every kernel has, so it is the one used everywhere.
Only IP packets are matched: ARP still works, so a cut looks like a silent
peer, not a missing one. A locally sent packet dropped by a qdisc is reported
to TCP as congestion (ENOBUFS), which TCP ignores and retransmits, so
``connect`` to a cut peer times out rather than failing fast.

Names and concurrency: every name carries the owner's pid and a per-process
serial number, so two harnesses at once, or two ``Network`` objects in one
process, never collide, and ``sweep_stale`` can tell leftovers of a crashed
run (owner pid gone) from a live run. Interface names are limited to 15
characters by the kernel, so in interface names the pid, serial and node id
are written in base 36 (a pid below 2**22 takes at most 5 characters);
namespace names have no such limit and use decimal. The /24 is picked among
10.213.0.0/16 so that no address or route of the root namespace overlaps it,
under a lock file, so two runs starting together pick different ones. A pid
can be reused by the OS, so leftovers whose pid now belongs to another
process are kept until that process is gone too: a sweep only ever deletes
too little, never a live run's network.

Every command has a timeout (``COMMAND_TIMEOUT_SECONDS``) and its exit code is
checked; a failure raises ``NetworkError`` naming the command and its stderr.
"""

from __future__ import annotations

import fcntl
import ipaddress
import itertools
import os
import re
import shutil
import subprocess
import time
from types import TracebackType

COMMAND_TIMEOUT_SECONDS = 10
LOCK_WAIT_SECONDS = 30
LOCK_POLL_SECONDS = 0.05
LOCK_FILE_PATH = "/run/kraftlog-netns.lock"

SUBNET_FIRST_TWO_OCTETS = "10.213"
SUBNET_PREFIX_LENGTH = 24
SUBNET_THIRD_OCTET_CHOICES = 256
BRIDGE_HOST_OCTET = 1
NODE_HOST_OCTET_OFFSET = 10
LARGEST_NODE_ID = 254 - NODE_HOST_OCTET_OFFSET

INTERFACE_NAME_MAX_CHARS = 15
NODE_INTERFACE = "eth0"
NAMESPACE_PREFIX = "kraftlog"
BRIDGE_PREFIX = "klb"
HOST_VETH_PREFIX = "klv"

#: htb handle, drop class and its leaf handle (see the module docstring).
ROOT_QDISC_HANDLE = "1:"
DROP_CLASS_ID = "1:1"
DROP_LEAF_HANDLE = "10:"
#: tc filter priorities are 1..65535; a peer's filter sits at 1 + its id.
FILTER_PRIORITY_OFFSET = 1

#: stderr fragments meaning "it is already gone", which teardown tolerates.
ALREADY_GONE_MARKERS = ("Cannot find device", "does not exist", "No such file or directory")

_serial_numbers = itertools.count()

_NAMESPACE_PATTERN = re.compile(rf"^{NAMESPACE_PREFIX}-(\d+)-(\d+)-\S+$")
_BRIDGE_PATTERN = re.compile(rf"^{BRIDGE_PREFIX}([0-9a-z]+)-([0-9a-z]+)$")
_HOST_VETH_PATTERN = re.compile(rf"^{HOST_VETH_PREFIX}([0-9a-z]+)-([0-9a-z]+)-([0-9a-z]+)$")


class NetworkError(RuntimeError):
    """A namespace, link, address or tc command failed (the message says which)."""


# ---------------------------------------------------------------- commands


def find_tool(name: str) -> str | None:
    """The path of ``ip``/``tc``: on PATH, or in the sbin directories that a
    non-login root shell may leave off PATH."""
    search_path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    return shutil.which(name, path=search_path)


def tool_path(name: str) -> str:
    path = find_tool(name)
    if path is None:
        raise NetworkError(f"`{name}` (iproute2) not found on PATH, /usr/sbin or /sbin")
    return path


def run_command(argv: list[str]) -> str:
    """Run one command with a timeout; its stdout, or NetworkError with the
    command and its stderr when it fails, times out or cannot start."""
    command_text = " ".join(argv)
    try:
        completed = subprocess.run(argv, capture_output=True, text=True,
                                   timeout=COMMAND_TIMEOUT_SECONDS, check=False)
    except subprocess.TimeoutExpired as error:
        raise NetworkError(f"`{command_text}` did not finish in "
                           f"{COMMAND_TIMEOUT_SECONDS} s") from error
    except OSError as error:
        raise NetworkError(f"`{command_text}` could not start: {error}") from error
    if completed.returncode != 0:
        raise NetworkError(f"`{command_text}` failed (exit {completed.returncode}): "
                           f"{completed.stderr.strip() or '(no stderr)'}")
    return completed.stdout


def is_already_gone(error: NetworkError) -> bool:
    return any(marker in str(error) for marker in ALREADY_GONE_MARKERS)


def delete_quietly_if_gone(argv: list[str]) -> None:
    """Run a delete command; a thing that is already gone is not an error."""
    try:
        run_command(argv)
    except NetworkError as error:
        if not is_already_gone(error):
            raise


def ip(*arguments: str) -> str:
    return run_command([tool_path("ip"), *arguments])


def tc_in(namespace: str, *arguments: str) -> str:
    return run_command([tool_path("tc"), "-netns", namespace, *arguments])


def namespace_names() -> list[str]:
    """``ip netns list`` prints ``name (id: N)``; the names only."""
    return [line.split()[0] for line in ip("netns", "list").splitlines() if line.strip()]


def link_names(link_type: str | None = None) -> list[str]:
    """Names of the root namespace's links (of one type, e.g. ``veth``)."""
    arguments = ["-o", "link", "show"] + (["type", link_type] if link_type else [])
    names = []
    for line in ip(*arguments).splitlines():
        # "12: klv1a2b-0-1@if2: <BROADCAST,..." -> "klv1a2b-0-1"
        fields = line.split(":", 2)
        if len(fields) >= 2:
            names.append(fields[1].strip().split("@", 1)[0])
    return names


# ---------------------------------------------------------------- names


def to_base36(number: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    if number < 0:
        raise ValueError(f"no base-36 form for negative {number}")
    text = ""
    while True:
        number, remainder = divmod(number, 36)
        text = digits[remainder] + text
        if number == 0:
            return text


def namespace_name(owner_pid: int, serial: int, node_label: str) -> str:
    return f"{NAMESPACE_PREFIX}-{owner_pid}-{serial}-{node_label}"


def bridge_name(owner_pid: int, serial: int) -> str:
    return checked_interface_name(
        f"{BRIDGE_PREFIX}{to_base36(owner_pid)}-{to_base36(serial)}")


def host_veth_name(owner_pid: int, serial: int, node_id: int) -> str:
    return checked_interface_name(
        f"{HOST_VETH_PREFIX}{to_base36(owner_pid)}-{to_base36(serial)}-{to_base36(node_id)}")


def checked_interface_name(name: str) -> str:
    if len(name) > INTERFACE_NAME_MAX_CHARS:
        raise NetworkError(f"interface name {name!r} is longer than the kernel's "
                           f"{INTERFACE_NAME_MAX_CHARS} characters (too many Networks "
                           "made by this process?)")
    return name


def process_is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def owner_is_gone(pid_text: str, base: int) -> bool:
    """Whether the pid in a name belongs to no process any more. Pid 0 and
    below are not pids (``kill(0, ...)`` means the process group), so they
    never count as gone: such a name is not ours to delete."""
    pid = int(pid_text, base)
    return pid > 0 and not process_is_alive(pid)


# ---------------------------------------------------------------- machine checks


def missing_privilege_reason() -> str | None:
    """Why this process cannot make namespaces, from what is cheap to check:
    being root and having ``ip`` and ``tc``."""
    uid = os.geteuid()
    if uid != 0:
        return (f"not root (uid {uid}): network namespaces need CAP_NET_ADMIN "
                "and CAP_SYS_ADMIN")
    for tool in ("ip", "tc"):
        if find_tool(tool) is None:
            return f"`{tool}` (iproute2) not found on PATH, /usr/sbin or /sbin"
    return None


def unavailable_reason() -> str | None:
    """None when this machine can run nodes in namespaces (root, ``ip`` and
    ``tc`` found, and a throwaway namespace can be added and deleted); else a
    sentence saying why not."""
    reason = missing_privilege_reason()
    if reason is not None:
        return reason
    probe = namespace_name(os.getpid(), next(_serial_numbers), "probe")
    try:
        ip("netns", "add", probe)
    except NetworkError as error:
        return f"cannot create a network namespace: {error}"
    try:
        ip("netns", "del", probe)
    except NetworkError as error:
        return f"created a network namespace but cannot delete it: {error}"
    return None


# ---------------------------------------------------------------- sweeping


def sweep_stale() -> list[str]:
    """Delete namespaces, bridges and veths left by earlier runs whose owning
    process is gone (every name carries its owner's pid); the names deleted.

    Host veth ends go first: deleting one end deletes the pair at once, while
    deleting a namespace frees its links only later, in the background.
    """
    deleted: list[str] = []
    for name in link_names("veth"):
        match = _HOST_VETH_PATTERN.match(name)
        if match and owner_is_gone(match.group(1), 36):
            delete_quietly_if_gone([tool_path("ip"), "link", "del", name])
            deleted.append(name)
    for name in namespace_names():
        match = _NAMESPACE_PATTERN.match(name)
        if match and owner_is_gone(match.group(1), 10):
            delete_quietly_if_gone([tool_path("ip"), "netns", "del", name])
            deleted.append(name)
    for name in link_names("bridge"):
        match = _BRIDGE_PATTERN.match(name)
        if match and owner_is_gone(match.group(1), 36):
            delete_quietly_if_gone([tool_path("ip"), "link", "del", name])
            deleted.append(name)
    return deleted


# ---------------------------------------------------------------- subnets


class SubnetLock:
    """An exclusive lock across processes while a subnet is picked and put on
    a bridge, so two runs starting at once cannot pick the same one. The wait
    is bounded: the holder runs a few commands that each have a timeout."""

    def __init__(self, path: str = LOCK_FILE_PATH) -> None:
        self.path = path
        self.descriptor: int | None = None

    def __enter__(self) -> SubnetLock:
        try:
            self.descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as error:
            raise NetworkError(f"cannot open lock file {self.path}: {error}") from error
        deadline = time.monotonic() + LOCK_WAIT_SECONDS
        while True:
            try:
                fcntl.flock(self.descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(self.descriptor)
                    raise NetworkError(f"lock {self.path} still held after "
                                       f"{LOCK_WAIT_SECONDS} s") from None
                time.sleep(LOCK_POLL_SECONDS)

    def __exit__(self, *exception: object) -> None:
        if self.descriptor is not None:
            os.close(self.descriptor)  # closing releases the flock
            self.descriptor = None


def networks_in_use() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network the root namespace has an address in or a route to
    (the default route aside: it overlaps everything by design)."""
    in_use = []
    for line in ip("-o", "-4", "addr", "show").splitlines():
        fields = line.split()
        if "inet" in fields:
            address = fields[fields.index("inet") + 1]
            in_use.append(ipaddress.ip_interface(address).network)
    for line in ip("-4", "route", "show", "table", "all").splitlines():
        fields = line.split()
        if fields and fields[0] in ("local", "broadcast", "unicast", "blackhole",
                                    "unreachable", "prohibit", "throw"):
            fields = fields[1:]
        if fields and fields[0] != "default":
            try:
                in_use.append(ipaddress.ip_network(fields[0], strict=False))
            except ValueError:
                continue
    return in_use


def free_subnet(start_choice: int) -> ipaddress.IPv4Network:
    """The first 10.213.K.0/24, trying K from ``start_choice`` round, that
    overlaps nothing the root namespace already uses."""
    in_use = networks_in_use()
    for step in range(SUBNET_THIRD_OCTET_CHOICES):
        third_octet = (start_choice + step) % SUBNET_THIRD_OCTET_CHOICES
        candidate = ipaddress.ip_network(
            f"{SUBNET_FIRST_TWO_OCTETS}.{third_octet}.0/{SUBNET_PREFIX_LENGTH}")
        if not any(candidate.overlaps(used) for used in in_use):
            return candidate
    raise NetworkError(f"every {SUBNET_FIRST_TWO_OCTETS}.K.0/{SUBNET_PREFIX_LENGTH} "
                       "overlaps an address or route already in use")


# ---------------------------------------------------------------- the network


class Network:
    """One bridge and one namespace per node; see the module docstring.

    Nothing exists until ``setup``; ``teardown`` removes all of it and may be
    called any number of times. Processes the harness started in a namespace
    are its own to stop: a namespace with processes still in it lives on,
    nameless and unplugged, until they exit.
    """

    def __init__(self, node_ids: list[int]) -> None:
        ids = list(node_ids)
        if len(set(ids)) != len(ids):
            raise ValueError(f"node ids repeat: {ids}")
        for node_id in ids:
            if not isinstance(node_id, int) or not 0 <= node_id <= LARGEST_NODE_ID:
                raise ValueError(f"node id {node_id!r} is not an int in 0..{LARGEST_NODE_ID} "
                                 f"(its address is .{NODE_HOST_OCTET_OFFSET} + id)")
        self.node_ids = ids
        self.owner_pid = os.getpid()
        self.serial = next(_serial_numbers)
        self.bridge = bridge_name(self.owner_pid, self.serial)
        self._host_veths = {i: host_veth_name(self.owner_pid, self.serial, i) for i in ids}
        self._namespaces = {i: namespace_name(self.owner_pid, self.serial, f"node{i}")
                            for i in ids}
        self._subnet: ipaddress.IPv4Network | None = None
        #: node id -> peers whose packets that node's namespace drops.
        self._dropping: dict[int, set[int]] = {i: set() for i in ids}

    # ------------------------------------------------------------ names and addresses

    def namespace(self, node_id: int) -> str:
        self._check_node(node_id)
        return self._namespaces[node_id]

    def names(self) -> list[str]:
        """Every namespace and interface name this network uses in the root
        namespace (whether or not they exist now)."""
        return [self.bridge, *self._host_veths.values(), *self._namespaces.values()]

    def address(self, node_id: int) -> str:
        self._check_node(node_id)
        return str(self._set_up_subnet()[NODE_HOST_OCTET_OFFSET + node_id])

    @property
    def host_address(self) -> str:
        """The bridge's address: the harness's own address on this network."""
        return str(self._set_up_subnet()[BRIDGE_HOST_OCTET])

    def wrap(self, node_id: int, argv: list[str]) -> list[str]:
        """``argv`` run inside the node's namespace (``ip netns exec`` execs
        it, so the process started is the node's own, same pid)."""
        return [tool_path("ip"), "netns", "exec", self.namespace(node_id), *argv]

    # ------------------------------------------------------------ lifecycle

    def setup(self) -> None:
        """Make the bridge, the namespaces and the veth pairs. On failure,
        whatever was made is deleted before the error is raised."""
        if self._subnet is not None:
            raise NetworkError(f"network {self.bridge} is already set up")
        reason = missing_privilege_reason()
        if reason is not None:
            raise NetworkError(f"cannot set up network namespaces: {reason}")
        try:
            self._make_bridge()
            for node_id in self.node_ids:
                self._make_node(node_id)
        except BaseException:
            try:
                self.teardown()
            except NetworkError:
                pass  # the first error says more than a failed clean-up
            raise

    def teardown(self) -> None:
        """Delete everything this network made; what is already gone is
        skipped. Every deletion is tried; the first real failure is raised
        after all were tried."""
        failures: list[NetworkError] = []
        steps = ([["link", "del", veth] for veth in self._host_veths.values()]
                 + [["netns", "del", ns] for ns in self._namespaces.values()]
                 + [["link", "del", self.bridge]])
        existing_namespaces = set(namespace_names())
        existing_links = set(link_names())
        for step in steps:
            target = step[-1]
            if target not in existing_namespaces and target not in existing_links:
                continue
            try:
                delete_quietly_if_gone([tool_path("ip"), *step])
            except NetworkError as error:
                failures.append(error)
        self._subnet = None
        self._dropping = {i: set() for i in self.node_ids}
        if failures:
            raise failures[0]

    def __enter__(self) -> Network:
        self.setup()
        return self

    def __exit__(self, exception_type: type[BaseException] | None,
                 exception: BaseException | None, traceback: TracebackType | None) -> None:
        self.teardown()

    # ------------------------------------------------------------ cuts

    def partition(self, groups: list[set[int]]) -> None:
        """Each node named in a group reaches only the nodes of its group (and
        the nodes named nowhere, which keep reaching everyone). Replaces
        every earlier cut; links that stay cut are never opened in between."""
        group_of: dict[int, int] = {}
        for index, group in enumerate(groups):
            for node_id in group:
                self._check_node(node_id)
                if node_id in group_of:
                    raise ValueError(f"node {node_id} is in two groups: {groups}")
                group_of[node_id] = index
        wanted = {frozenset({a, b}) for a, b in itertools.combinations(sorted(group_of), 2)
                  if group_of[a] != group_of[b]}
        self._cut_exactly(wanted)

    def isolate(self, node_id: int, from_nodes: set[int]) -> None:
        """Cut ``node_id`` from each of ``from_nodes`` (itself excepted), on top
        of the cuts already in place."""
        self._check_node(node_id)
        for other in from_nodes:
            self._check_node(other)
        added = {frozenset({node_id, other}) for other in from_nodes if other != node_id}
        self._cut_exactly(self.cut_pairs() | added)

    def cut_pairs(self) -> set[frozenset[int]]:
        """The pairs of nodes with a cut between them now."""
        return {frozenset({node_id, peer})
                for node_id, peers in self._dropping.items() for peer in peers}

    def heal(self) -> None:
        """Remove every cut: delete the tc qdisc of every namespace with one.
        Tries every namespace before raising the first real failure."""
        errors: list[NetworkError] = []
        for node_id, peers in self._dropping.items():
            if not peers:
                continue
            try:
                tc_in(self._namespaces[node_id], "qdisc", "del", "dev", NODE_INTERFACE, "root")
            except NetworkError as error:
                if not is_already_gone(error):
                    errors.append(error)
                    continue
            peers.clear()
        if errors:
            raise errors[0]

    # ------------------------------------------------------------ internals

    def _check_node(self, node_id: int) -> None:
        if node_id not in self._namespaces:
            raise ValueError(f"node {node_id!r} is not in this network {self.node_ids}")

    def _set_up_subnet(self) -> ipaddress.IPv4Network:
        if self._subnet is None:
            raise NetworkError("network is not set up: addresses are picked by setup()")
        return self._subnet

    def _make_bridge(self) -> None:
        with SubnetLock():
            subnet = free_subnet(start_choice=self.owner_pid + self.serial)
            ip("link", "add", self.bridge, "type", "bridge")
            self._subnet = subnet
            ip("addr", "add", f"{self.host_address}/{SUBNET_PREFIX_LENGTH}", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")

    def _make_node(self, node_id: int) -> None:
        namespace = self._namespaces[node_id]
        host_veth = self._host_veths[node_id]
        ip("netns", "add", namespace)
        ip("-netns", namespace, "link", "set", "lo", "up")
        # Made with its far end already inside the namespace, so the name
        # NODE_INTERFACE never exists in the root namespace.
        ip("link", "add", host_veth, "type", "veth",
           "peer", "name", NODE_INTERFACE, "netns", namespace)
        ip("link", "set", host_veth, "master", self.bridge)
        ip("link", "set", host_veth, "up")
        ip("-netns", namespace, "addr", "add",
           f"{self.address(node_id)}/{SUBNET_PREFIX_LENGTH}", "dev", NODE_INTERFACE)
        ip("-netns", namespace, "link", "set", NODE_INTERFACE, "up")
        ip("-netns", namespace, "route", "add", "default", "via", self.host_address)

    def _cut_exactly(self, wanted: set[frozenset[int]]) -> None:
        """Make the cuts exactly ``wanted``: add the new drops first, then lift
        the old ones, so nothing that stays cut is reachable in between."""
        wanted_drops = {(a, b) for pair in wanted for a, b in (tuple(pair), tuple(pair)[::-1])}
        current_drops = {(node_id, peer)
                         for node_id, peers in self._dropping.items() for peer in peers}
        for node_id, peer in sorted(wanted_drops - current_drops):
            self._start_dropping(node_id, peer)
        for node_id, peer in sorted(current_drops - wanted_drops):
            self._stop_dropping(node_id, peer)

    def _start_dropping(self, node_id: int, peer: int) -> None:
        namespace = self._namespaces[node_id]
        first_cut = not self._dropping[node_id]
        if first_cut:
            self._install_drop_qdisc(namespace)
        try:
            tc_in(namespace, "filter", "add", "dev", NODE_INTERFACE, "parent",
                  ROOT_QDISC_HANDLE, "protocol", "ip", "prio", str(FILTER_PRIORITY_OFFSET + peer),
                  "u32", "match", "ip", "dst", f"{self.address(peer)}/32",
                  "flowid", DROP_CLASS_ID)
        except NetworkError:
            if first_cut:
                tc_in(namespace, "qdisc", "del", "dev", NODE_INTERFACE, "root")
            raise
        self._dropping[node_id].add(peer)

    def _stop_dropping(self, node_id: int, peer: int) -> None:
        namespace = self._namespaces[node_id]
        if self._dropping[node_id] == {peer}:
            # The last cut of this namespace: remove the qdisc altogether, so
            # a healed namespace is exactly as setup left it.
            tc_in(namespace, "qdisc", "del", "dev", NODE_INTERFACE, "root")
        else:
            tc_in(namespace, "filter", "del", "dev", NODE_INTERFACE, "parent",
                  ROOT_QDISC_HANDLE, "protocol", "ip", "prio", str(FILTER_PRIORITY_OFFSET + peer))
        self._dropping[node_id].discard(peer)

    @staticmethod
    def _install_drop_qdisc(namespace: str) -> None:
        """htb at the root (unclassified packets bypass it through its direct
        queue) with one class whose queue holds nothing: what is sent to that
        class is dropped. Half-made, it is removed again, so the namespace is
        either ready to drop or as setup left it."""
        tc_in(namespace, "qdisc", "add", "dev", NODE_INTERFACE, "root",
              "handle", ROOT_QDISC_HANDLE, "htb")
        try:
            # The rate is never used: the leaf drops before htb would shape.
            tc_in(namespace, "class", "add", "dev", NODE_INTERFACE, "parent",
                  ROOT_QDISC_HANDLE, "classid", DROP_CLASS_ID,
                  "htb", "rate", "1kbit", "quantum", "1514")
            tc_in(namespace, "qdisc", "add", "dev", NODE_INTERFACE, "parent", DROP_CLASS_ID,
                  "handle", DROP_LEAF_HANDLE, "pfifo", "limit", "0")
        except NetworkError:
            tc_in(namespace, "qdisc", "del", "dev", NODE_INTERFACE, "root")
            raise
