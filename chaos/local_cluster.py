"""``kraftlog cluster up|down|status --dir DIR``: a local cluster that outlives
the command that started it.

Why: trying kraftlog as a cluster (failover, replication, the CLI against
several brokers) should take one command, not six shells. ``up`` writes one
TOML config per node into DIR, starts every node as a detached ``kraftlog
node --config`` process (its own session, output in ``DIR/node-<id>.log``)
and waits, with a deadline, until an active controller exists and every
broker is running. ``DIR/cluster.json`` records each node's id, roles,
listener URLs, pid and config path, so any later command (this one, a
script, a person) can find, stop or restart a node. Data stays in
``DIR/node-<id>/`` between runs: ``down`` stops the processes; ``up`` on the
same DIR starts the stopped nodes again on their data, ports and configs.

Layouts are those of ``chaos/cluster.py`` (``node_roles``): controllers
1..C and brokers C+1..C+B, or N combined nodes 1..N. A controller takes two
free ports (HTTP, and Raft at HTTP + 1). Nodes run with the production
defaults of ``kraft/config.py`` and ``storage/config.py``, plus topic
defaults sized to the cluster (``cluster_defaults``) and the user's ``--set``
settings.

``up --secure`` makes the cluster TLS from scratch: on its first start a CA,
one certificate per node and a client certificate go into ``DIR/certs/``
(``api.certs``; kept across restarts, so the CA the nodes trust never
changes under them), every node's config gets the TLS settings (both
listeners SSL, ``ssl.cafile``, its own ``ssl.certfile``/``ssl.keyfile``,
``ssl.client.auth = required``), and ``cluster.json`` records ``"secure":
true``. Every later command on DIR reads that: URLs are ``https://``, and the
health probes of ``up`` and ``status`` trust the CA and present the client
certificate. ``up`` prints the ``KRAFTLOG_SSL_*`` variables the CLI needs.

Pids are reused by the OS, so a pid counts as a node's process only while its
command line is ``... node --config <that node's config file>``
(``node_config_of``); nothing else is ever signalled.

Like ``chaos/cluster.py`` this sees the system as a user does: config files,
processes and the HTTP inspection endpoints (``/healthz``, ``/v1/quorum``);
it imports no broker or controller code. Every wait has a deadline.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import shutil
import signal
import ssl
import subprocess
import sys
import time
import tomllib
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TextIO

from api import table
from api.certs import DEFAULT_HOSTS, Issued
from api.certs import create as create_certificates
from chaos.cluster import (RAFT_SECRET_FILE, REPO_ROOT, free_port, http_json, node_command,
                           node_config_values, node_roles, voters_text, write_node_config,
                           write_raft_secret)

CLUSTER_FILE = "cluster.json"
#: flock'ed by ``up`` and ``down`` so two of them never race on one DIR.
LOCK_FILE = ".cluster.lock"
FORMAT_VERSION = 1

DEFAULT_CONTROLLERS = 3
DEFAULT_BROKERS = 3
#: A limit on the layout: more nodes than this is a mistake on one machine.
NODES_MAX = 32

#: Each HTTP probe of a node waits at most this long.
PROBE_TIMEOUT_S = 1.0
#: How often ``up`` and ``down`` look again while waiting.
POLL_INTERVAL_S = 0.2
#: ``up`` repeats an unchanged progress line after this long.
PROGRESS_REPEAT_S = 5.0
#: After SIGKILL, how long ``down`` waits for the processes to vanish.
KILL_WAIT_S = 5.0
#: GET /v1/quorum through a broker waits for the controllers (up to 5 s each,
#: in parallel: api/broker/server.py QUORUM_PROXY_TIMEOUT_S); a little more.
QUORUM_TIMEOUT_S = 6.0
#: How much of a node's log ``up`` reads to quote its last line.
LOG_TAIL_BYTES = 4096

#: Keys ``up`` sets per node; ``--set`` may not change them.
LAYOUT_KEYS = frozenset({"node.id", "process.roles", "controller.quorum.voters", "listeners",
                         "log.dirs", "log.dir", "metadata.log.dir"})
#: TLS keys ``up --secure`` sets (to DIR/certs); ``--set`` may not set them:
#: ``up`` must know how to reach the nodes.
TLS_KEYS = frozenset({"listener.security.protocol.map", "ssl.certfile", "ssl.keyfile",
                      "ssl.cafile"})
#: Where ``up --secure`` keeps the CA and the certificates, under DIR.
CERTS_DIR = "certs"
#: The hosts the node certificates name: the nodes listen on 127.0.0.1.
CERT_HOSTS = DEFAULT_HOSTS


class ClusterError(Exception):
    """A failure the CLI reports in one line, exit status 1."""


# -- the cluster's description (cluster.json) ------------------------------
@dataclass
class LocalNode:
    node_id: int
    roles: tuple[str, ...]
    broker_port: int | None       # BROKER listener, None unless a broker
    controller_port: int | None   # CONTROLLER listener (Raft at + 1), None unless a controller
    config_path: str              # absolute: `kraftlog node --config` restarts the node
    log_path: str                 # the node's stdout and stderr
    data_dir: str                 # log.dirs; the metadata log is inside it
    pid: int | None = None        # last started process; None once `down` stopped it
    tls: bool = False             # its listeners are SSL (`up --secure`): https:// URLs
    kafka_port: int | None = None  # KAFKA listener (Kafka's protocol), a broker's

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    @property
    def broker_url(self) -> str | None:
        return (None if self.broker_port is None
                else f"{self.scheme}://127.0.0.1:{self.broker_port}")

    @property
    def controller_url(self) -> str | None:
        return (None if self.controller_port is None
                else f"{self.scheme}://127.0.0.1:{self.controller_port}")

    @property
    def kafka_address(self) -> str | None:
        """``host:port`` of its KAFKA listener, as Kafka clients take it."""
        return None if self.kafka_port is None else f"127.0.0.1:{self.kafka_port}"

    @property
    def is_broker(self) -> bool:
        return self.broker_port is not None

    @property
    def is_controller(self) -> bool:
        return self.controller_port is not None

    def to_json(self) -> dict[str, Any]:
        return {"id": self.node_id, "roles": list(self.roles), "broker_url": self.broker_url,
                "controller_url": self.controller_url, "kafka_address": self.kafka_address,
                "pid": self.pid,
                "config_path": self.config_path, "log_path": self.log_path,
                "data_dir": self.data_dir}

    @classmethod
    def from_json(cls, entry: Mapping[str, Any]) -> LocalNode:
        urls = [url for url in (entry.get("broker_url"), entry.get("controller_url")) if url]
        return cls(node_id=int(entry["id"]), roles=tuple(entry["roles"]),
                   broker_port=_port_of(entry.get("broker_url")),
                   controller_port=_port_of(entry.get("controller_url")),
                   config_path=str(entry["config_path"]), log_path=str(entry["log_path"]),
                   data_dir=str(entry["data_dir"]),
                   pid=None if entry.get("pid") is None else int(entry["pid"]),
                   tls=any(urllib.parse.urlsplit(url).scheme == "https" for url in urls),
                   # A cluster.json written before KAFKA listeners has none.
                   kafka_port=_port_of("//" + entry["kafka_address"])
                   if entry.get("kafka_address") else None)


def _port_of(url: str | None) -> int | None:
    if url is None:
        return None
    port = urllib.parse.urlsplit(url).port
    if port is None:
        raise ValueError(f"{url!r} has no port")
    return port


@dataclass
class LocalCluster:
    base_dir: str                 # absolute
    controllers: int
    brokers: int
    combined: bool
    settings: dict[str, Any]      # the user's --set values, as parsed
    nodes: dict[int, LocalNode]   # by node id
    secure: bool = False          # TLS everywhere, certificates in DIR/certs (`up --secure`)

    @property
    def path(self) -> str:
        return os.path.join(self.base_dir, CLUSTER_FILE)

    @property
    def broker_ids(self) -> list[int]:
        return [i for i, node in sorted(self.nodes.items()) if node.is_broker]

    @property
    def controller_ids(self) -> list[int]:
        return [i for i, node in sorted(self.nodes.items()) if node.is_controller]

    @property
    def bootstrap_url(self) -> str:
        return self.nodes[self.broker_ids[0]].broker_url or ""

    @property
    def kafka_bootstrap(self) -> str:
        """The brokers' KAFKA listeners, as Kafka's bootstrap.servers ("" for
        a cluster made before they existed)."""
        return ",".join(self.nodes[i].kafka_address for i in self.broker_ids
                        if self.nodes[i].kafka_address)

    @property
    def layout_text(self) -> str:
        text = layout_text(self.controllers, self.brokers, self.combined)
        return text + (", TLS with client certificates" if self.secure else "")

    @property
    def cert_dir(self) -> str:
        return os.path.join(self.base_dir, CERTS_DIR)

    def certificates(self) -> dict[str, Issued]:
        """The files of ``up --secure`` (named as ``api.certs.create`` names
        them): "ca" (its ``certfile`` is ca.pem), "node-<id>" and "client"."""
        def issued(stem: str) -> Issued:
            return Issued(os.path.join(self.cert_dir, f"{stem}.pem"),
                          os.path.join(self.cert_dir, f"{stem}-key.pem"))
        return {"ca": issued("ca"), **{f"node-{i}": issued(f"node-{i}") for i in self.nodes},
                "client": issued("client")}

    def client_security(self) -> dict[str, str] | None:
        """Kafka's client settings for this cluster (None without TLS)."""
        if not self.secure:
            return None
        files = self.certificates()
        return {"security_protocol": "SSL", "ssl_cafile": files["ca"].certfile,
                "ssl_certfile": files["client"].certfile,
                "ssl_keyfile": files["client"].keyfile}

    def to_json(self) -> dict[str, Any]:
        return {"format_version": FORMAT_VERSION,
                "layout": {"controllers": self.controllers, "brokers": self.brokers,
                           "combined": self.combined},
                "secure": self.secure,
                "settings": self.settings,
                "bootstrap": self.bootstrap_url,
                "kafka_bootstrap": self.kafka_bootstrap,
                "nodes": [node.to_json() for _, node in sorted(self.nodes.items())]}

    def save(self) -> None:
        """Replace cluster.json atomically: a reader never sees half a file."""
        temp = self.path + ".tmp"
        with open(temp, "w") as f:
            json.dump(self.to_json(), f, indent=2)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, self.path)

    @classmethod
    def load(cls, base_dir: str) -> LocalCluster:
        base_dir = os.path.abspath(os.path.expanduser(base_dir))
        path = os.path.join(base_dir, CLUSTER_FILE)
        try:
            with open(path) as f:
                raw = json.load(f)
        except FileNotFoundError:
            raise ClusterError(
                f"{base_dir} has no {CLUSTER_FILE}: no cluster was started there "
                f"(start one with `kraftlog cluster up --dir {base_dir}`)") from None
        except (OSError, ValueError) as exc:
            raise ClusterError(f"cannot read {path}: {exc}") from None
        try:
            if raw["format_version"] != FORMAT_VERSION:
                raise ValueError(f"format_version {raw['format_version']} is not "
                                 f"{FORMAT_VERSION}")
            layout = raw["layout"]
            nodes = [LocalNode.from_json(entry) for entry in raw["nodes"]]
            cluster = cls(base_dir, int(layout["controllers"]), int(layout["brokers"]),
                          bool(layout["combined"]), dict(raw.get("settings") or {}),
                          {node.node_id: node for node in nodes},
                          secure=bool(raw.get("secure", False)))
        except (KeyError, TypeError, ValueError) as exc:
            raise ClusterError(f"{path} is damaged ({type(exc).__name__}: {exc})") from None
        if not cluster.broker_ids or not cluster.controller_ids:
            raise ClusterError(f"{path} is damaged: it needs a broker and a controller")
        if any(node.tls != cluster.secure for node in nodes):
            raise ClusterError(f"{path} is damaged: \"secure\" is {str(cluster.secure).lower()}"
                               " but not every node URL is " +
                               ("https://" if cluster.secure else "http://"))
        return cluster

    def write_configs(self) -> None:
        voters = voters_text({i: n.controller_port for i, n in self.nodes.items()
                              if n.controller_port is not None})
        settings = {**cluster_defaults(len(self.broker_ids)), **self.settings}
        if len(self.controller_ids) > 1 and "controller.quorum.secret.file" not in settings:
            settings["controller.quorum.secret.file"] = write_raft_secret(
                os.path.join(self.base_dir, RAFT_SECRET_FILE))
        files = self.certificates()
        if self.secure:
            kafka = ",KAFKA:SSL" if self.kafka_bootstrap else ""
            settings = {"listener.security.protocol.map": f"BROKER:SSL,CONTROLLER:SSL{kafka}",
                        "ssl.cafile": files["ca"].certfile, "ssl.client.auth": "required",
                        **settings}
        for node in self.nodes.values():
            header = (f"Node {node.node_id} of the cluster in {self.base_dir}, written by "
                      "`kraftlog cluster up`.\nRestart it alone with: "
                      f"kraftlog node --config {node.config_path}")
            node_settings = settings
            if self.secure:
                own = files[f"node-{node.node_id}"]
                node_settings = {"ssl.certfile": own.certfile, "ssl.keyfile": own.keyfile,
                                 **settings}
            write_node_config(node.config_path, node_config_values(
                node.node_id, node.roles, voters, node.broker_port, node.controller_port,
                node.data_dir, node_settings, kafka_port=node.kafka_port), header)


def layout_text(controllers: int, brokers: int, combined: bool) -> str:
    if combined:
        return f"{_plural(controllers, 'combined node')} (controller + broker)"
    return f"{_plural(controllers, 'controller')} + {_plural(brokers, 'broker')}"


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def cluster_defaults(broker_count: int) -> dict[str, Any]:
    """Topic defaults sized to the cluster, as configs/cluster/ sets them:
    three replicas where there are three brokers, and acks=all needing all
    but one of them. ``--set`` overrides these."""
    replication_factor = min(3, broker_count)
    return {"default.replication.factor": replication_factor,
            "min.insync.replicas": max(1, min(2, replication_factor - 1))}


def resolve_layout(controllers: int | None, brokers: int | None, combined: int | None
                   ) -> tuple[int, int, bool] | None:
    """The layout the flags ask for: (controllers, brokers, combined); None
    if no flag was given (an existing cluster keeps its own, a new one gets
    3 + 3)."""
    if combined is not None:
        if controllers is not None or brokers is not None:
            raise ClusterError("--combined N runs N nodes that are both controller and "
                               "broker: give it alone, or use --controllers/--brokers")
        layout = (combined, combined, True)
    elif controllers is None and brokers is None:
        return None
    else:
        layout = (DEFAULT_CONTROLLERS if controllers is None else controllers,
                  DEFAULT_BROKERS if brokers is None else brokers, False)
    count_c, count_b, is_combined = layout
    if count_c < 1 or count_b < 1:
        flag = "--combined" if is_combined else ("--controllers" if count_c < 1 else "--brokers")
        raise ClusterError(f"{flag} must be at least 1")
    total = count_c if is_combined else count_c + count_b
    if total > NODES_MAX:
        raise ClusterError(f"{total} nodes is more than the {NODES_MAX} this command runs "
                           "on one machine")
    return layout


def parse_settings(items: Iterable[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` items: the value as TOML reads it (numbers,
    booleans, quoted strings), else as text."""
    settings: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key:
            raise ClusterError(f"--set {item!r}: use KEY=VALUE, e.g. "
                               "--set log.retention.ms=3600000")
        if key in LAYOUT_KEYS:
            raise ClusterError(f"--set {key}: `cluster up` sets {key} per node; "
                               f"its keys {', '.join(sorted(LAYOUT_KEYS))} cannot be set")
        if key in TLS_KEYS:
            raise ClusterError(f"--set {key}: use --secure, which makes a CA and certificates "
                               f"in DIR/{CERTS_DIR} and sets {', '.join(sorted(TLS_KEYS))} "
                               "itself (for your own certificates, write node configs and run "
                               "`kraftlog node --config`)")
        settings[key] = parse_setting(value)
    return settings


def parse_setting(text: str) -> Any:
    """A ``--set`` value as TOML reads it when it can (numbers, booleans,
    quoted strings), else the text itself: what ``kraftlog node --set``
    does too."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def plan_cluster(base_dir: str, controllers: int, brokers: int, combined: bool,
                 settings: Mapping[str, Any],
                 pick_port: Callable[[bool], int] | None = None,
                 secure: bool = False) -> LocalCluster:
    """A new cluster's nodes, paths and ports (nothing written or started).
    ``pick_port(pair)`` returns a free port (and, with ``pair``, the next one
    free too: a controller's Raft port); tests pass a deterministic one.
    ``secure``: TLS listeners (``up --secure``)."""
    if pick_port is None:
        taken: set[int] = set()

        def pick_port(pair: bool) -> int:
            return free_port(pair=pair, taken=taken)

    nodes = {}
    for node_id, roles in node_roles(controllers, brokers, combined).items():
        nodes[node_id] = LocalNode(
            node_id, roles,
            broker_port=pick_port(False) if "broker" in roles else None,
            controller_port=pick_port(True) if "controller" in roles else None,
            config_path=os.path.join(base_dir, f"node-{node_id}.toml"),
            log_path=os.path.join(base_dir, f"node-{node_id}.log"),
            data_dir=os.path.join(base_dir, f"node-{node_id}"), tls=secure,
            kafka_port=pick_port(False) if "broker" in roles else None)
    return LocalCluster(base_dir, controllers, brokers if not combined else controllers,
                        combined, dict(settings), nodes, secure=secure)


# -- TLS (`up --secure`) -----------------------------------------------------
def ensure_certificates(cluster: LocalCluster, nodes_running: bool) -> None:
    """A secure cluster's CA, node and client certificates in DIR/certs:
    made when none exist and no node runs (the first ``up --secure``, or
    after a person deleted DIR/certs of a stopped cluster), else kept as
    they are: the nodes trust that CA."""
    files = _certificate_files(cluster)
    missing = [path for path in files if not os.path.exists(path)]
    if not missing:
        return
    if len(missing) == len(files) and not nodes_running:
        try:
            create_certificates(cluster.cert_dir, nodes=max(cluster.nodes), hosts=CERT_HOSTS)
        except OSError as exc:
            raise ClusterError(f"cannot write certificates to {cluster.cert_dir}: {exc}") \
                from None
        return
    raise _missing_certificates(cluster, missing)


def _certificate_files(cluster: LocalCluster) -> list[str]:
    """Every file of DIR/certs the nodes and clients need (the CA's key only
    signs, so not that one)."""
    return [path for name, issued in cluster.certificates().items()
            for path in ((issued.certfile,) if name == "ca" else
                         (issued.certfile, issued.keyfile))]


def _missing_certificates(cluster: LocalCluster, missing: list[str]) -> ClusterError:
    names = ", ".join(os.path.basename(path) for path in missing)
    return ClusterError(
        f"{cluster.cert_dir} is missing {names}: restore them, or stop the cluster "
        f"(`kraftlog cluster down --dir {cluster.base_dir}`), delete {cluster.cert_dir} and "
        f"run `kraftlog cluster up --dir {cluster.base_dir}` to make a new CA and "
        "certificates (clients then need the new ca.pem and client certificate)")


def client_context(cluster: LocalCluster) -> ssl.SSLContext | None:
    """What ``up`` and ``status`` call a secure cluster's nodes with: its CA
    trusted, its client certificate presented (the nodes require one);
    None without TLS."""
    security = cluster.client_security()
    if security is None:
        return None
    from protocol import tls

    missing = [path for path in _certificate_files(cluster) if not os.path.exists(path)]
    if missing:
        raise _missing_certificates(cluster, missing)
    try:
        return tls.client_context(security["ssl_cafile"], security["ssl_certfile"],
                                  security["ssl_keyfile"])
    except tls.TlsConfigError as exc:
        raise ClusterError(f"cannot use the cluster's client certificate: {exc}") from None


def security_exports(cluster: LocalCluster) -> str | None:
    """The shell line that points the ``kraftlog`` CLI at a secure
    cluster's CA and client certificate (None without TLS)."""
    security = cluster.client_security()
    if security is None:
        return None
    return ("export KRAFTLOG_SECURITY_PROTOCOL=SSL "
            f"KRAFTLOG_SSL_CAFILE={shlex.quote(security['ssl_cafile'])} "
            f"KRAFTLOG_SSL_CERTFILE={shlex.quote(security['ssl_certfile'])} "
            f"KRAFTLOG_SSL_KEYFILE={shlex.quote(security['ssl_keyfile'])}")


# -- processes ---------------------------------------------------------------
def process_args(pid: int) -> list[str] | None:
    """A live process's command line; None if there is none (or a zombie,
    which has exited and only waits for its parent)."""
    if os.path.isdir("/proc/self"):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
            # The state letter follows the ")" that closes the command name.
            if stat[stat.rindex(b")") + 2:][:1] in (b"Z", b"X"):
                return None
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                raw = f.read()
        except (OSError, ValueError):
            return None
        return [arg.decode(errors="replace") for arg in raw.split(b"\0") if arg] or None
    try:  # No /proc (macOS, BSD): ask ps. Arguments are split at spaces.
        result = subprocess.run(["ps", "-o", "stat=,command=", "-p", str(pid)],
                                capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    state, _, command = result.stdout.strip().partition(" ")
    if result.returncode != 0 or not command or state.startswith("Z"):
        return None
    return command.split()


def node_config_of(pid: int) -> str | None:
    """The config file (real absolute path) that process ``pid`` runs a
    ``kraftlog node`` with; None if ``pid`` is not a live node."""
    args = process_args(pid)
    if not args or "node" not in args:
        return None
    config = None
    for i, arg in enumerate(args):
        if arg == "--config" and i + 1 < len(args):
            config = args[i + 1]
        elif arg.startswith("--config="):
            config = arg.partition("=")[2]
    if not config:
        return None
    if not os.path.isabs(config):
        try:
            config = os.path.join(os.readlink(f"/proc/{pid}/cwd"), config)
        except OSError:
            return None
    return os.path.realpath(config)


def live_pids(nodes: Iterable[LocalNode]) -> dict[int, int]:
    """Node id -> pid of the node's running process: the recorded pid if it
    still runs the node, else (on Linux) any process running the node's
    config, e.g. one a person restarted with ``kraftlog node --config``."""
    found: dict[int, int] = {}
    missing: dict[str, int] = {}
    for node in nodes:
        config = os.path.realpath(node.config_path)
        if node.pid is not None and node_config_of(node.pid) == config:
            found[node.node_id] = node.pid
        else:
            missing[config] = node.node_id
    if missing and os.path.isdir("/proc/self"):
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != os.getpid():
                config = node_config_of(int(entry))
                if config in missing:
                    found.setdefault(missing[config], int(entry))
    return found


def start_node(node: LocalNode) -> subprocess.Popen:
    """Start a node detached: its own session (a terminal's Ctrl-C or hang-up
    does not reach it), no stdin, output appended to its log."""
    os.makedirs(node.data_dir, exist_ok=True)
    with open(node.log_path, "ab") as log:
        log.write(f"--- kraftlog cluster up: starting node {node.node_id} at "
                  f"{time.strftime('%Y-%m-%d %H:%M:%S')} ---\n".encode())
        log.flush()
        return subprocess.Popen(node_command(node.config_path), cwd=REPO_ROOT,
                                stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)


def last_log_line(path: str) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - LOG_TAIL_BYTES))
            tail = f.read().decode(errors="replace")
    except OSError:
        return ""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        raise ClusterError(f"not allowed to signal pid {pid}: is it another user's?") from None


def _wait_gone(cluster: LocalCluster, pids: Mapping[int, int], deadline: float) -> dict[int, int]:
    """Wait until none of ``pids`` runs its node or ``deadline`` passes;
    the ones still running."""
    while True:
        running = {i: pid for i, pid in pids.items()
                   if node_config_of(pid) == os.path.realpath(cluster.nodes[i].config_path)}
        now = time.monotonic()
        if not running or now >= deadline:
            return running
        time.sleep(min(POLL_INTERVAL_S, deadline - now))


@contextlib.contextmanager
def dir_lock(base_dir: str) -> Iterator[None]:
    with open(os.path.join(base_dir, LOCK_FILE), "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ClusterError(f"another `kraftlog cluster` command is working on {base_dir}; "
                               "wait for it to finish") from None
        yield


# -- health ------------------------------------------------------------------
@dataclass
class NodeHealth:
    alive: bool                       # its process runs
    broker: dict | None = None        # GET <broker_url>/healthz; None: no answer
    controller: dict | None = None    # GET <controller_url>/healthz; None: no answer

    @property
    def broker_state(self) -> str:
        return str(self.broker.get("state")) if self.broker else "no answer"

    @property
    def active_controller(self) -> bool:
        return bool(self.controller and self.controller.get("active"))


def _get(url: str, timeout_s: float, context: ssl.SSLContext | None = None) -> dict | None:
    try:
        _, body = http_json(url, timeout_s=timeout_s, context=context)
    except (OSError, ValueError):
        return None
    return body if isinstance(body, dict) else None


def probe(cluster: LocalCluster, pids: Mapping[int, int], timeout_s: float,
          context: ssl.SSLContext | None = None) -> dict[int, NodeHealth]:
    """Every node's health, asked in parallel (at most ``timeout_s`` each);
    ``context``: a secure cluster's (``client_context``)."""
    healths = {i: NodeHealth(alive=i in pids) for i in cluster.nodes}
    jobs = []
    for node_id, node in cluster.nodes.items():
        if node_id in pids:
            if node.broker_url:
                jobs.append((node_id, "broker", node.broker_url + "/healthz"))
            if node.controller_url:
                jobs.append((node_id, "controller", node.controller_url + "/healthz"))
    if jobs:
        with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
            answers = list(pool.map(lambda job: _get(job[2], timeout_s, context), jobs))
        for (node_id, role, _), answer in zip(jobs, answers):
            setattr(healths[node_id], role, answer)
    return healths


def describe_state(node: LocalNode, health: NodeHealth) -> str:
    """The STATE column: "down", else the broker's lifecycle state and/or
    whether the controller is the active one, e.g. "running, active"."""
    if not health.alive:
        return "down"
    parts = []
    if node.is_broker:
        parts.append(health.broker_state)
    if node.is_controller:
        parts.append("no answer" if health.controller is None
                     else "active" if health.active_controller else "standby")
    return ", ".join(parts)


def is_ready(cluster: LocalCluster, healths: Mapping[int, NodeHealth]) -> bool:
    return (any(healths[i].active_controller for i in cluster.controller_ids)
            and all(healths[i].broker_state == "running" for i in cluster.broker_ids))


def progress_text(cluster: LocalCluster, healths: Mapping[int, NodeHealth]) -> str:
    active = [i for i in cluster.controller_ids if healths[i].active_controller]
    waiting = [f"{i}: {healths[i].broker_state}" for i in cluster.broker_ids
               if healths[i].broker_state != "running"]
    running = len(cluster.broker_ids) - len(waiting)
    text = (f"active controller: {active[0] if active else 'none yet'}; "
            f"brokers running: {running}/{len(cluster.broker_ids)}")
    return text + (f" (not yet: {', '.join(waiting)})" if waiting else "")


TABLE_HEADER = ("ID", "ROLES", "PID", "BROKER URL", "CONTROLLER URL", "STATE")


def table_rows(cluster: LocalCluster, pids: Mapping[int, int],
               healths: Mapping[int, NodeHealth]) -> list[tuple[str, ...]]:
    return [(str(i), ",".join(node.roles), str(pids[i]) if i in pids else "-",
             node.broker_url or "-", node.controller_url or "-",
             describe_state(node, healths[i]))
            for i, node in sorted(cluster.nodes.items())]


def status_table(rows: list[tuple[str, ...]], header: tuple[str, ...] = TABLE_HEADER) -> str:
    return table.format_table(header, rows)


def quorum_status(cluster: LocalCluster, healths: Mapping[int, NodeHealth],
                  context: ssl.SSLContext | None = None) -> dict | None:
    """GET /v1/quorum from the first answering broker (which asks the
    controllers), else from a controller directly."""
    urls = [cluster.nodes[i].broker_url + "/v1/quorum" for i in cluster.broker_ids
            if healths[i].broker is not None]
    urls += [cluster.nodes[i].controller_url + "/v1/quorum" for i in cluster.controller_ids
             if healths[i].controller is not None]
    for url in urls:
        status = _get(url, QUORUM_TIMEOUT_S, context)
        if status is not None and "error" not in status:
            return status
    return None


def quorum_text(status: dict | None, alive_ids: Iterable[int]) -> str:
    """The active controller line of ``status``; it names a leader whose
    process is gone as such (the quorum notices only after its timeouts)."""
    if status is None:
        return "Active controller: unknown (no controller answered)"
    leader = status.get("leader_id")
    if leader is None:
        return f"Active controller: none (election under way, term {status.get('term')})"
    if leader not in set(alive_ids):
        return (f"Active controller: node {leader} per the quorum, but its process is down "
                "(an election follows)")
    return (f"Active controller: node {leader} (term {status.get('term')}, "
            f"commit index {status.get('commit_index')})")


# -- the commands ------------------------------------------------------------
def _say(out: TextIO, text: str = "") -> None:
    print(text, file=out, flush=True)


def cluster_up(base_dir: str, *, controllers: int | None = None, brokers: int | None = None,
               combined: int | None = None, set_items: Iterable[str] = (),
               timeout_s: float = 60.0, secure: bool = False,
               out: TextIO = sys.stdout) -> int:
    """Create (or restart the stopped nodes of) the cluster in ``base_dir``
    and wait until it serves; print its table and how to use it.
    ``secure``: a new cluster gets TLS everywhere (an existing one keeps
    what it was made with; asking a plaintext one for TLS is refused)."""
    if timeout_s <= 0:
        raise ClusterError("--timeout-s must be positive")
    base_dir = os.path.abspath(os.path.expanduser(base_dir))
    set_items = list(set_items)
    settings = parse_settings(set_items)
    layout = resolve_layout(controllers, brokers, combined)
    if (not os.path.exists(os.path.join(base_dir, CLUSTER_FILE)) and os.path.isdir(base_dir)
            and set(os.listdir(base_dir)) - {LOCK_FILE}):
        raise ClusterError(f"{base_dir} is not empty and has no {CLUSTER_FILE}: "
                           "choose a new or empty --dir")
    try:
        os.makedirs(base_dir, exist_ok=True)
    except OSError as exc:
        raise ClusterError(f"cannot create {base_dir}: {exc}") from None
    with dir_lock(base_dir):
        if os.path.exists(os.path.join(base_dir, CLUSTER_FILE)):
            cluster = LocalCluster.load(base_dir)
            _check_same_cluster(cluster, layout, settings, set_items, secure)
            _say(out, f"Cluster in {base_dir}: {cluster.layout_text}")
            if cluster.secure:
                ensure_certificates(cluster, nodes_running=bool(live_pids(cluster.nodes.values())))
        else:
            if set(os.listdir(base_dir)) - {LOCK_FILE}:  # another command raced us
                raise ClusterError(f"{base_dir} is not empty and has no {CLUSTER_FILE}: "
                                   "choose a new or empty --dir")
            count_c, count_b, is_combined = layout or (DEFAULT_CONTROLLERS, DEFAULT_BROKERS,
                                                       False)
            cluster = plan_cluster(base_dir, count_c, count_b, is_combined, settings,
                                   secure=secure)
            if secure:
                ensure_certificates(cluster, nodes_running=False)
            cluster.write_configs()
            cluster.save()
            _say(out, f"New cluster in {base_dir}: {cluster.layout_text}")
            if secure:
                _say(out, f"  CA, node and client certificates in {cluster.cert_dir}")
        context = client_context(cluster)  # before starting anything: the files must do
        pids = live_pids(cluster.nodes.values())
        started: dict[int, subprocess.Popen] = {}
        for node_id, node in sorted(cluster.nodes.items()):
            roles = ",".join(node.roles)
            if node_id in pids:
                node.pid = pids[node_id]
                _say(out, f"  node {node_id} ({roles}) is running, pid {node.pid}: left alone")
                continue
            started[node_id] = start_node(node)
            node.pid = started[node_id].pid
            cluster.save()  # record each pid at once: a crash here leaves none unknown
            _say(out, f"  started node {node_id} ({roles}), pid {node.pid}, "
                      f"log {node.log_path}")
        cluster.save()
        pids = {i: node.pid for i, node in cluster.nodes.items() if node.pid is not None}
        healths = _wait_until_ready(cluster, pids, started, timeout_s, out, context)
    _say(out)
    _say(out, status_table(table_rows(cluster, pids, healths)))
    _say(out)
    _say(out, f"Use it:   export KRAFTLOG_BOOTSTRAP={cluster.bootstrap_url}")
    exports = security_exports(cluster)
    if exports:
        _say(out, f"          {exports}")
        _say(out, "          (every listener is TLS and requires a client certificate: "
                  "these give the CLI the cluster's CA and client certificate)")
    if cluster.kafka_bootstrap:
        files = cluster.certificates()
        tls_text = (f" security.protocol=SSL ssl.ca.location={files['ca'].certfile} "
                    f"ssl.certificate.location={files['client'].certfile} "
                    f"ssl.key.location={files['client'].keyfile}") if cluster.secure else ""
        _say(out, f"Kafka clients: bootstrap.servers={cluster.kafka_bootstrap}{tls_text}")
    _say(out, f"Inspect:  kraftlog cluster status --dir {base_dir}")
    _say(out, f"Stop it:  kraftlog cluster down --dir {base_dir}")
    return 0


def _check_same_cluster(cluster: LocalCluster, layout: tuple[int, int, bool] | None,
                        settings: Mapping[str, Any], set_items: Iterable[str],
                        secure: bool = False) -> None:
    """Flags that shape a new cluster may repeat an existing one's shape, not
    change it: a restart keeps the recorded configs. A secure cluster stays
    secure without --secure; a plaintext one is not made secure by it."""
    recorded = (cluster.controllers, cluster.brokers, cluster.combined)
    hint = (f"drop those flags to restart it as recorded, edit its "
            f"{cluster.base_dir}/node-<id>.toml files, or use a new --dir")
    if layout is not None and layout != recorded:
        raise ClusterError(f"{cluster.base_dir} holds a cluster of {cluster.layout_text}, "
                           f"not {layout_text(*layout)}: {hint}")
    if list(set_items) and dict(settings) != cluster.settings:
        raise ClusterError(f"{cluster.base_dir} holds a cluster made with other --set "
                           f"settings ({cluster.settings or 'none'}): {hint}")
    if secure and not cluster.secure:
        raise ClusterError(f"{cluster.base_dir} holds a cluster made without --secure (plain "
                           "HTTP listeners); --secure only makes a new cluster TLS: drop it "
                           "to restart this one as recorded, or use a new --dir")


def _wait_until_ready(cluster: LocalCluster, pids: Mapping[int, int],
                      started: Mapping[int, subprocess.Popen], timeout_s: float,
                      out: TextIO, context: ssl.SSLContext | None = None
                      ) -> dict[int, NodeHealth]:
    start = time.monotonic()
    deadline = start + timeout_s
    last_text, last_said = "", 0.0
    while True:
        for node_id, process in started.items():
            code = process.poll()
            if code is not None:
                node = cluster.nodes[node_id]
                raise ClusterError(
                    f"node {node_id} exited with code {code} while starting: "
                    f"{last_log_line(node.log_path)!r} (log: {node.log_path})")
        remaining_s = deadline - time.monotonic()
        healths = probe(cluster, pids, max(0.1, min(PROBE_TIMEOUT_S, remaining_s)), context)
        text = progress_text(cluster, healths)
        now = time.monotonic()
        if is_ready(cluster, healths):
            _say(out, f"  ready after {now - start:.1f} s: {text}")
            return healths
        if text != last_text or now - last_said >= PROGRESS_REPEAT_S:
            _say(out, f"  waiting ({now - start:.0f} s): {text}")
            last_text, last_said = text, now
        if now >= deadline:
            raise ClusterError(
                f"not ready after {timeout_s:g} s ({text}); the nodes keep running: read "
                f"{cluster.base_dir}/node-<id>.log, or stop them with "
                f"`kraftlog cluster down --dir {cluster.base_dir}`")
        time.sleep(min(POLL_INTERVAL_S, max(0.0, deadline - now)))


def cluster_down(base_dir: str, *, timeout_s: float = 30.0, purge: bool = False,
                 out: TextIO = sys.stdout) -> int:
    """SIGTERM every running node (brokers first, so their controlled
    shutdown still finds the controllers), SIGKILL what outlives
    ``timeout_s``; keep the data unless ``purge``."""
    if timeout_s <= 0:
        raise ClusterError("--timeout-s must be positive")
    cluster = LocalCluster.load(base_dir)
    base_dir = cluster.base_dir
    with dir_lock(base_dir):
        pids = live_pids(cluster.nodes.values())
        if not pids:
            _say(out, f"No node of the cluster in {base_dir} is running.")
        deadline = time.monotonic() + timeout_s
        broker_only = [i for i in cluster.broker_ids if not cluster.nodes[i].is_controller]
        the_rest = [i for i in sorted(cluster.nodes) if i not in broker_only]
        for phase in (broker_only, the_rest):
            phase_pids = {i: pids[i] for i in phase if i in pids}
            for node_id, pid in phase_pids.items():
                _say(out, f"  stopping node {node_id} ({','.join(cluster.nodes[node_id].roles)})"
                          f", pid {pid}")
                _signal(pid, signal.SIGTERM)
            _wait_gone(cluster, phase_pids, deadline)
        stuck = _wait_gone(cluster, pids, time.monotonic())
        for node_id, pid in stuck.items():
            _say(out, f"  node {node_id} did not stop within {timeout_s:g} s: SIGKILL")
            _signal(pid, signal.SIGKILL)
        stuck = _wait_gone(cluster, stuck, time.monotonic() + KILL_WAIT_S)
        if stuck:
            raise ClusterError(f"nodes {sorted(stuck)} (pids {sorted(stuck.values())}) "
                               f"still run {KILL_WAIT_S:g} s after SIGKILL")
        for node in cluster.nodes.values():
            node.pid = None
        if purge:
            shutil.rmtree(base_dir)
            _say(out, f"Stopped {_plural(len(pids), 'node')} and deleted {base_dir}.")
            return 0
        cluster.save()
    _say(out, f"Stopped {_plural(len(pids), 'node')}. Data, configs and logs stay in "
              f"{base_dir}.")
    _say(out, f"Start it again on its data: kraftlog cluster up --dir {base_dir}")
    _say(out, f"Delete it:                  kraftlog cluster down --dir {base_dir} --purge")
    return 0


def cluster_status(base_dir: str, *, as_json: bool = False, out: TextIO = sys.stdout) -> int:
    """Print every node with its live state, and the active controller."""
    cluster = LocalCluster.load(base_dir)
    pids = live_pids(cluster.nodes.values())
    context = client_context(cluster)
    healths = probe(cluster, pids, PROBE_TIMEOUT_S, context)
    quorum = quorum_status(cluster, healths, context)
    if as_json:
        nodes = [{**node.to_json(), "pid": pids.get(i), "state": describe_state(node, healths[i]),
                  "broker_health": healths[i].broker, "controller_health": healths[i].controller}
                 for i, node in sorted(cluster.nodes.items())]
        _say(out, json.dumps({"dir": cluster.base_dir, "layout": cluster.to_json()["layout"],
                              "secure": cluster.secure,
                              "client_security": cluster.client_security(),
                              "bootstrap": cluster.bootstrap_url, "nodes": nodes,
                              "quorum": quorum}, indent=2))
        return 0
    _say(out, f"Cluster in {cluster.base_dir}: {cluster.layout_text}")
    _say(out)
    _say(out, status_table(table_rows(cluster, pids, healths)))
    _say(out)
    if not pids:
        _say(out, f"No node is running. Start them: kraftlog cluster up --dir {cluster.base_dir}")
        return 0
    _say(out, quorum_text(quorum, pids))
    if len(pids) < len(cluster.nodes):
        _say(out, f"Restart stopped nodes: kraftlog cluster up --dir {cluster.base_dir}")
    serving = [cluster.nodes[i].broker_url for i in cluster.broker_ids
               if healths[i].broker is not None]
    _say(out, f"Use it: export KRAFTLOG_BOOTSTRAP={(serving or [cluster.bootstrap_url])[0]}")
    exports = security_exports(cluster)
    if exports:
        _say(out, f"        {exports}")
    return 0
