"""A cluster of real ``kraftlog node`` processes on loopback.

Tests, benchmarks and the chaos harness start clusters with this; it sees the
system as a user does: it writes TOML configs, runs ``python -m api.cli node
--config ...`` per node (output in ``<dir>/node-<id>.log``), and talks HTTP to
the inspection endpoints. Nothing here imports broker or controller code.

Layouts: ``controllers`` dedicated controllers (ids 1..C) plus ``brokers``
dedicated brokers (ids C+1..C+B), or, with ``combined=True``, ``controllers``
nodes that are both. Ports are free ephemeral ports picked at construction; a
controller takes two (HTTP, and Raft at HTTP + 1).

The layout, config and command helpers (``node_roles``, ``node_config_values``,
``write_node_config``, ``node_command``) are shared with
``chaos/local_cluster.py``, the detached cluster of ``kraftlog cluster up``.

Every wait is bounded: ``wait_until`` polls a condition until a deadline and
raises ``TimeoutError`` saying what it waited for.
"""

from __future__ import annotations

import base64
import json
import os
import random
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOOPBACK = "127.0.0.1"

#: Settings that make a test cluster react in well under a second or two.
FAST_SETTINGS: dict[str, Any] = {
    "broker.session.timeout.ms": 1500,
    "broker.heartbeat.interval.ms": 250,
    "controller.quorum.election.timeout.ms": 300,
    "controller.quorum.fetch.timeout.ms": 1000,
    "log.flush.interval.ms": 1000,
}


#: Ports handed out by :func:`free_port` in this process (any thread).
_HANDED_OUT: set[int] = set()
_PORTS_LOCK = threading.Lock()
#: Its own generator: a test seeding ``random`` must not make processes pick
#: alike, nor may forked children.
_PORT_RANDOM = random.Random()
os.register_at_fork(after_in_child=_PORT_RANDOM.seed)


def _listen_port_range() -> tuple[int, int]:
    """Where :func:`free_port` picks: the 16,384 ports just below the kernel's
    ephemeral range, or those above it when there is no room below. A port
    picked from inside that range can be taken by any outgoing connection
    (another node's, a client's) between the pick and the node's bind, and a
    Raft port taken so stops the controller from starting."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(v) for v in f.read().split()[:2])
    except (OSError, ValueError):
        low, high = 32768, 60999
    if low - 1024 >= 4096:
        return max(1024, low - 16384), low
    if 65535 - high >= 4096:
        return high + 1, 65536
    return 1024, 65536  # no room outside it: anywhere, checked by binding


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(pair: bool = False, taken: set[int] | None = None) -> int:
    """A port free now on 127.0.0.1 (and, with ``pair``, the next one too),
    outside the ephemeral range, not in ``taken`` and never handed out before
    by this process (until most of the range has been); the port(s) are added
    to ``taken``."""
    taken = set() if taken is None else taken
    low, high = _listen_port_range()
    with _PORTS_LOCK:
        if len(_HANDED_OUT) > (high - low) // 2:
            _HANDED_OUT.clear()
        for _ in range(1000):
            port = _PORT_RANDOM.randrange(low, high - 1)
            ports = (port, port + 1) if pair else (port,)
            if any(p in taken or p in _HANDED_OUT or not _bindable(p) for p in ports):
                continue
            taken.update(ports)
            _HANDED_OUT.update(ports)
            return port
    raise RuntimeError(f"no free port found in {low}-{high - 1}")


def wait_until(condition: Callable[[], Any], timeout_s: float, what: str,
               interval_s: float = 0.05) -> Any:
    """Poll ``condition`` until it returns something truthy; that value."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while True:
        try:
            value = condition()
            if value:
                return value
        except Exception as exc:  # the condition is a probe: keep polling
            last_error = exc
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_error})" if last_error else ""
            raise TimeoutError(f"timed out after {timeout_s:.1f} s waiting for {what}{detail}")
        time.sleep(interval_s)


def http_json(url: str, body: Any = None, timeout_s: float = 5.0,
              context: ssl.SSLContext | None = None) -> tuple[int, Any]:
    """GET (or POST ``body`` as JSON) and return (status, decoded JSON);
    ``context``: what an https URL is verified with."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={
        "Content-Type": "application/json", "Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s, context=context) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


def metric(url: str, name: str, timeout_s: float = 5.0,
           context: ssl.SSLContext | None = None) -> float:
    """The value of an unlabelled metric on a broker's ``/metrics``."""
    with urllib.request.urlopen(url + "/metrics", timeout=timeout_s,
                                context=context) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise LookupError(f"{name} is not in {url}/metrics")


RAFT_SECRET_FILE = "raft-secret"
TOKEN_SECRET_FILE = "token-secret"


def write_raft_secret(path: str) -> str:
    """A random controller.quorum.secret.file readable only by its owner
    (kept if it exists: a cluster restarted keeps its secret)."""
    if not os.path.exists(path):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(base64.urlsafe_b64encode(os.urandom(32)).decode() + "\n")
    return path


def process_cpu_times(pid: int) -> tuple[float, float]:
    """CPU seconds (user, system) process ``pid`` has used so far, from
    /proc (``OSError`` where there is none, or the process is gone)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # fields 3.. of proc(5)
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def process_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far."""
    return sum(process_cpu_times(pid))


def node_roles(controllers: int, brokers: int, combined: bool
               ) -> dict[int, tuple[str, ...]]:
    """Node id -> roles for a layout: controllers 1..C and brokers C+1..C+B,
    or (``combined``) nodes 1..C that are both. Roles in ``process.roles``
    order ("broker" before "controller")."""
    controller_ids = list(range(1, controllers + 1))
    broker_ids = controller_ids if combined else list(
        range(controllers + 1, controllers + brokers + 1))
    return {node_id: tuple(role for role, ids in (("broker", broker_ids),
                                                  ("controller", controller_ids))
                           if node_id in ids)
            for node_id in sorted(set(controller_ids) | set(broker_ids))}


def voters_text(controller_ports: Mapping[int, int],
                hosts: Mapping[int, str] | None = None) -> str:
    """``controller.quorum.voters``: controllers on loopback, or on ``hosts``."""
    hosts = hosts or {}
    return ",".join(f"{node_id}@{hosts.get(node_id, LOOPBACK)}:{port}"
                    for node_id, port in sorted(controller_ports.items()))


def node_config_values(node_id: int, roles: tuple[str, ...], voters: str,
                       broker_port: int | None, controller_port: int | None,
                       log_dir: str, settings: Mapping[str, Any],
                       host: str = "127.0.0.1", kafka_port: int | None = None
                       ) -> dict[str, Any]:
    """One node's config: its identity, listeners (on ``host``; ``kafka_port``:
    a KAFKA listener too) and data directory, then ``settings`` (shared by
    every node of the cluster)."""
    listeners = []
    if broker_port:
        listeners.append(f"BROKER://{host}:{broker_port}")
    if controller_port:
        listeners.append(f"CONTROLLER://{host}:{controller_port}")
    if kafka_port:
        listeners.append(f"KAFKA://{host}:{kafka_port}")
    return {
        "node.id": node_id,
        "process.roles": ",".join(roles),
        "controller.quorum.voters": voters,
        "listeners": ",".join(listeners),
        "log.dirs": log_dir,
        **settings,
    }


def write_node_config(path: str, values: Mapping[str, Any], header: str = "") -> None:
    """Write ``values`` as a TOML file ``kraftlog node --config`` reads;
    ``header`` lines become comments at the top."""
    with open(path, "w") as f:
        for line in header.splitlines():
            f.write(f"# {line}".rstrip() + "\n")
        if header:
            f.write("\n")
        for key, value in values.items():
            f.write(f"{json.dumps(key)} = {_toml_value(value)}\n")


def node_command(config_path: str) -> list[str]:
    """The command that runs one node (run it with ``cwd=REPO_ROOT``)."""
    return [sys.executable, "-m", "api.cli", "node", "--config", config_path]


class NodeNetwork(Protocol):
    """What ``ProcessCluster`` needs of a network other than loopback."""

    def address(self, node_id: int) -> str: ...

    def wrap(self, node_id: int, argv: list[str]) -> list[str]: ...


@dataclass
class NodeProcess:
    node_id: int
    roles: tuple[str, ...]
    config_path: str
    log_path: str
    broker_port: int | None
    controller_port: int | None
    host: str = LOOPBACK
    tls: bool = False
    #: Its KAFKA listener's port (Kafka's protocol), if it has one.
    kafka_port: int | None = None
    process: subprocess.Popen | None = None
    paused: bool = False

    @property
    def kafka_address(self) -> str:
        """``host:port`` of its KAFKA listener, as Kafka clients take it."""
        assert self.kafka_port is not None, f"node {self.node_id} has no KAFKA listener"
        return f"{self.host}:{self.kafka_port}"

    @property
    def broker_url(self) -> str:
        assert self.broker_port is not None, f"node {self.node_id} is not a broker"
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.broker_port}"

    @property
    def controller_url(self) -> str:
        assert self.controller_port is not None, f"node {self.node_id} is not a controller"
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.controller_port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass
class ProcessCluster:
    base_dir: str
    controllers: int = 3
    brokers: int = 3
    combined: bool = False
    settings: Mapping[str, Any] = field(default_factory=lambda: dict(FAST_SETTINGS))
    #: Where the nodes live: None for loopback, or a ``chaos.netns.Network``
    #: (already set up) that gives each node an address and runs it in its
    #: own network namespace.
    network: NodeNetwork | None = None
    #: Authenticate the controllers' Raft traffic with a shared secret made up
    #: for this cluster (``controller.quorum.secret.file``). Off only for the
    #: test that shows what an unauthenticated Raft port lets a peer do.
    raft_secret: bool = True
    #: TLS on every listener: a CA and node certificates made for this
    #: cluster under ``<base_dir>/certs`` (``api.certs``), every node's
    #: listeners SSL; ``client_security`` is what a client needs to connect.
    tls: bool = False
    #: With ``tls``: ACLs on (``authorizer.class.name``), the nodes' and the
    #: client certificate's principals super users (``super_users``).
    acls: bool = False
    #: With ``tls``: the BROKER listeners SASL_SSL (the CONTROLLER's stay
    #: SSL): clients may log in as SCRAM users (``add_user``); the nodes and
    #: the client certificate still authenticate with certificates.
    sasl: bool = False
    #: Brokers get a KAFKA listener (Kafka's protocol) too: ``kafka_bootstrap``
    #: (with ``tls``, SSL, or SASL_SSL with ``sasl``, as the BROKER listeners).
    kafka: bool = False
    #: Log directories per broker: 1 is ``data-<id>``; more are
    #: ``data-<id>/d0``, ``d1``, ... (``log_dirs_of``), the first also
    #: holding the metadata.
    log_dirs: int = 1
    #: Extra environment per node id (for example ``chaos.faultyio``'s, to
    #: give one of its log dirs disk errors).
    env: dict[int, dict[str, str]] = field(default_factory=dict)
    nodes: dict[int, NodeProcess] = field(default_factory=dict, init=False)
    #: Controllers added by ``add_joining_controller``: outside the static
    #: voters, started with controller.quorum.join.
    joining: set[int] = field(default_factory=set, init=False)
    certs: dict = field(default_factory=dict, init=False)
    ssl_context: ssl.SSLContext | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        os.makedirs(self.base_dir, exist_ok=True)
        if self.raft_secret and "controller.quorum.secret.file" not in self.settings:
            self.settings = {**self.settings, "controller.quorum.secret.file":
                             write_raft_secret(os.path.join(self.base_dir, RAFT_SECRET_FILE))}
        taken: set[int] = set()
        for node_id, roles in node_roles(self.controllers, self.brokers,
                                         self.combined).items():
            self.nodes[node_id] = NodeProcess(
                node_id, roles,
                config_path=os.path.join(self.base_dir, f"node-{node_id}.toml"),
                log_path=os.path.join(self.base_dir, f"node-{node_id}.log"),
                broker_port=free_port(taken=taken) if "broker" in roles else None,
                controller_port=free_port(pair=True, taken=taken)
                if "controller" in roles else None,
                host=self.network.address(node_id) if self.network else LOOPBACK,
                tls=self.tls,
                kafka_port=free_port(taken=taken) if self.kafka and "broker" in roles
                else None)
        if self.tls:
            self._make_certificates()
        for node in self.nodes.values():
            self._write_config(node)

    def _make_certificates(self) -> None:
        from api import certs
        hosts = sorted({*certs.DEFAULT_HOSTS, *(n.host for n in self.nodes.values())})
        self.certs = certs.create(os.path.join(self.base_dir, "certs"),
                                  nodes=max(self.nodes), hosts=hosts)
        broker_protocol = "SASL_SSL" if self.sasl else "SSL"
        kafka = f",KAFKA:{broker_protocol}" if self.kafka else ""
        self.settings = {"listener.security.protocol.map":
                         f"BROKER:{broker_protocol},CONTROLLER:SSL{kafka}",
                         "ssl.cafile": self.certs["ca"].certfile, **self.settings}
        if self.acls:
            self.settings = {"authorizer.class.name": "kraftlog.StandardAuthorizer",
                             "super.users": ";".join(self.super_users), **self.settings}
        # Delegation tokens work on a TLS cluster: the key their HMACs use.
        self.settings = {"delegation.token.secret.key.file": write_raft_secret(
            os.path.join(self.base_dir, TOKEN_SECRET_FILE)), **self.settings}
        self.ssl_context = ssl.create_default_context(cafile=self.certs["ca"].certfile)
        self.ssl_context.load_cert_chain(self.certs["client"].certfile,
                                         self.certs["client"].keyfile)

    @property
    def super_users(self) -> list[str]:
        """The principals of the nodes' certificates and of the client's
        (``api.certs`` names them; ssl.principal.mapping.rules DEFAULT)."""
        from api import certs
        return [f"User:{certs.subject_of(name)}"
                for name in [*(f"node-{n}" for n in sorted(self.nodes)), "client"]]

    @property
    def client_security(self) -> dict[str, Any]:
        """The TLS settings of a client of this cluster (none without TLS)."""
        if not self.tls:
            return {}
        return {"security_protocol": "SSL", "ssl_cafile": self.certs["ca"].certfile,
                "ssl_certfile": self.certs["client"].certfile,
                "ssl_keyfile": self.certs["client"].keyfile}

    @property
    def kafka_bootstrap(self) -> str:
        """The brokers' KAFKA listeners, as Kafka's bootstrap.servers."""
        return ",".join(self.nodes[b].kafka_address for b in self.broker_ids)

    def user_security(self, user: str, password: str) -> dict[str, Any]:
        """The settings of a client of this cluster that logs in as SCRAM
        ``user`` (SASL_SSL) with the CA and no certificate of its own."""
        return {"security_protocol": "SASL_SSL", "ssl_cafile": self.certs["ca"].certfile,
                "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": user,
                "sasl_plain_password": password}

    def add_user(self, user: str, password: str, grants: list | tuple = (),
                 timeout_s: float = 30.0) -> None:
        """Make SCRAM ``user`` (a ``sasl`` cluster's) with the ACLs ``grants``
        (``AclBinding``s), as the administrator (the client certificate),
        and wait until every broker lets it log in. The ACLs go first, so a
        broker that knows the user knows its ACLs too (they apply the
        metadata in order)."""
        from api.client import Admin

        if not self.sasl:
            raise ValueError("add_user needs a cluster made with sasl=True")
        brokers = [node.broker_url for node in self.nodes.values() if node.broker_port]
        with Admin(brokers, request_timeout_ms=10_000, **self.client_security) as admin:
            if grants:
                admin.create_acls(list(grants))
            admin.upsert_user(user, password)

        def everywhere() -> bool:
            for url in brokers:
                with Admin(url, request_timeout_ms=5000,
                           **self.user_security(user, password)) as admin:
                    admin.list_topics()  # refused until this broker knows the user
            return True
        wait_until(everywhere, timeout_s, f"every broker to let {user} log in",
                   interval_s=0.2)

    # -- configs ----------------------------------------------------------
    @property
    def voters(self) -> str:
        """The static voters (every controller but those added to join)."""
        return voters_text({n.node_id: n.controller_port for n in self.nodes.values()
                            if n.controller_port and n.node_id not in self.joining},
                           {n.node_id: n.host for n in self.nodes.values()})

    def add_joining_controller(self, node_id: int | None = None) -> NodeProcess:
        """A new dedicated controller (not started) configured as a user
        adds one to a running quorum: the static voters in its
        controller.quorum.voters and controller.quorum.join = true; then
        ``kraftlog quorum add-controller`` makes it a voter."""
        if self.tls or self.network is not None:
            raise ValueError("joining controllers are made on plain loopback clusters only")
        node_id = node_id if node_id is not None else max(self.nodes) + 1
        assert node_id not in self.nodes, f"node {node_id} exists"
        taken = {p for n in self.nodes.values()
                 for p in (n.broker_port, n.controller_port, n.kafka_port) if p}
        node = NodeProcess(node_id, ("controller",),
                           config_path=os.path.join(self.base_dir, f"node-{node_id}.toml"),
                           log_path=os.path.join(self.base_dir, f"node-{node_id}.log"),
                           broker_port=None, controller_port=free_port(pair=True, taken=taken))
        self.nodes[node_id] = node
        self.joining.add(node_id)
        self._write_config(node)
        return node

    def _write_config(self, node: NodeProcess, voters: str | None = None,
                      join: bool = False) -> None:
        settings = self.settings
        if join or node.node_id in self.joining:
            settings = {**settings, "controller.quorum.join": True}
        if self.tls:
            own = self.certs[f"node-{node.node_id}"]
            settings = {"ssl.certfile": own.certfile, "ssl.keyfile": own.keyfile, **settings}
        write_node_config(node.config_path, node_config_values(
            node.node_id, node.roles, voters or self.voters, node.broker_port,
            node.controller_port,
            ",".join(self.log_dirs_of(node.node_id)), settings, node.host, node.kafka_port))

    def metadata_dir_of(self, node_id: int) -> str:
        """Where a controller keeps its Raft journal and snapshots: the
        default ``metadata.log.dir``, as docs/config.md names it."""
        return os.path.join(self.log_dirs_of(node_id)[0], "__cluster_metadata")

    def rewrite_config(self, node_id: int, joining_voters: list[int]) -> None:
        """A controller's config as docs/quorum.md has a user write it to
        add the controller back: ``controller.quorum.voters`` the current
        voters (``joining_voters``, not naming it) and
        ``controller.quorum.join``. Other nodes keep their static lists."""
        voters = voters_text({n: self.nodes[n].controller_port for n in joining_voters},
                             {n.node_id: n.host for n in self.nodes.values()})
        self._write_config(self.nodes[node_id], voters=voters, join=True)

    def log_dirs_of(self, node_id: int) -> list[str]:
        """The node's log directories (``log.dirs``), in order."""
        data = os.path.join(self.base_dir, f"data-{node_id}")
        if self.log_dirs == 1:
            return [data]
        return [os.path.join(data, f"d{i}") for i in range(self.log_dirs)]

    # -- processes ----------------------------------------------------------
    def start(self, node_ids: list[int] | None = None) -> None:
        for node_id in node_ids or sorted(self.nodes):
            node = self.nodes[node_id]
            assert not node.running, f"node {node_id} is already running"
            log = open(node.log_path, "ab")
            command = node_command(node.config_path)
            if self.network is not None:
                command = self.network.wrap(node_id, command)
            env = {**os.environ, **self.env[node_id]} if node_id in self.env else None
            node.process = subprocess.Popen(
                command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, env=env)
            log.close()
            node.paused = False

    def kill(self, node_id: int, sig: int = signal.SIGKILL, timeout_s: float = 15.0) -> None:
        """Send ``sig`` and wait for the process to end (SIGKILL: at once;
        SIGTERM: after its graceful shutdown)."""
        node = self.nodes[node_id]
        if node.process is None:
            return
        if node.paused and sig != signal.SIGKILL:  # SIGKILL needs no waking
            node.process.send_signal(signal.SIGCONT)
        node.paused = False
        if node.process.poll() is None:
            node.process.send_signal(sig)
            node.process.wait(timeout=timeout_s)

    def pause(self, node_id: int) -> None:
        node = self.nodes[node_id]
        assert node.running
        node.process.send_signal(signal.SIGSTOP)
        node.paused = True

    def resume(self, node_id: int) -> None:
        node = self.nodes[node_id]
        node.process.send_signal(signal.SIGCONT)
        node.paused = False

    def cpu_seconds(self) -> dict[int, float] | None:
        """CPU seconds (user + system) each running node process has used so
        far, by node id, from /proc; None where there is no /proc."""
        try:
            return {node_id: process_cpu_seconds(node.process.pid)
                    for node_id, node in self.nodes.items() if node.running}
        except OSError:
            return None

    def stop(self) -> None:
        """Kill every node (SIGKILL: tests want speed, not grace)."""
        for node_id in self.nodes:
            try:
                self.kill(node_id, signal.SIGKILL)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass

    def __enter__(self) -> "ProcessCluster":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def log_tail(self, node_id: int, lines: int = 40) -> str:
        try:
            with open(self.nodes[node_id].log_path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    # -- observation ------------------------------------------------------
    @property
    def controller_ids(self) -> list[int]:
        return [n for n, node in sorted(self.nodes.items()) if node.controller_port]

    @property
    def broker_ids(self) -> list[int]:
        return [n for n, node in sorted(self.nodes.items()) if node.broker_port]

    def quorum(self, node_id: int, timeout_s: float = 2.0) -> dict | None:
        node = self.nodes[node_id]
        if not node.running or node.paused:
            return None
        try:
            return http_json(node.controller_url + "/v1/quorum", timeout_s=timeout_s,
                             context=self.ssl_context)[1]
        except (OSError, ValueError):
            return None

    def active_controller(self) -> int | None:
        """The controller that says it is active, if exactly one does."""
        active = []
        for node_id in self.controller_ids:
            status = self.quorum(node_id)
            if status and status.get("active"):
                active.append(node_id)
        return active[0] if len(active) == 1 else None

    def wait_for_active_controller(self, timeout_s: float = 15.0,
                                   exclude: tuple[int, ...] = ()) -> int:
        return wait_until(lambda: (c := self.active_controller()) not in exclude and c,
                          timeout_s, "an active controller")

    def controller_call(self, path: str, body: Any, timeout_s: float = 10.0
                        ) -> tuple[int, Any]:
        """POST JSON to the active controller, waiting for one to exist."""
        active = self.wait_for_active_controller(timeout_s)
        return http_json(self.nodes[active].controller_url + path, body, timeout_s,
                         self.ssl_context)

    def metadata(self, node_id: int) -> dict:
        """A controller's image (GET /v1/metadata)."""
        return http_json(self.nodes[node_id].controller_url + "/v1/metadata",
                         context=self.ssl_context)[1]

    def broker_health(self, node_id: int) -> dict | None:
        node = self.nodes[node_id]
        if not node.running or node.paused:
            return None
        try:
            return http_json(node.broker_url + "/healthz", timeout_s=2.0,
                             context=self.ssl_context)[1]
        except (OSError, ValueError):
            return None

    def wait_for_brokers_running(self, broker_ids: list[int] | None = None,
                                 timeout_s: float = 20.0) -> None:
        ids = broker_ids if broker_ids is not None else self.broker_ids
        # Running, and watched: the active controller holds its presence
        # stream, so a kill from here on is noticed at once.
        wait_until(lambda: all((health := self.broker_health(b) or {}).get("state") == "running"
                               and health.get("presence") for b in ids),
                   timeout_s, f"brokers {ids} running")


def _toml_value(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return json.dumps(str(value))
