"""A node's configuration: one TOML file, keys spelled as Kafka spells them.

``load_node_config(path, overrides)`` reads the file, applies ``key=value``
overrides (the command line's ``--set``), and returns a ``NodeConfig``. Every
key is declared once, with its type, default, range and doc, in
``kraft/config_schema.py``: an unknown key is refused with the nearest valid
name, every value is checked against its declaration, and
``NodeConfig.settings`` hands the components typed values (a key left unset
with no default is absent, so the component's own rule applies).
``print_config`` shows the effective config (``kraftlog node
--print-config``). What needs more than one key (roles against listeners,
timeouts against each other) is checked here too.

Addresses. ``controller.quorum.voters`` (``1@127.0.0.1:9093,...``) names every
controller by the address of its ``CONTROLLER`` listener: the HTTP API that
brokers and the CLI call. A controller's Raft traffic (pysyncobj's own TCP
protocol, which cannot share a port with HTTP) uses the same host and the port
plus ``controller.quorum.raft.port.offset`` (default 1, so 9093 -> 9094).
Deriving the Raft address keeps one list of voters to configure, as in Kafka.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import ipaddress
import logging
import os
import ssl
import tomllib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kraft.authorizer import AUTHORIZER_NAMES, STANDARD_AUTHORIZER, AclSettings
from kraft.config_schema import BY_NAME, SCHEMA, ConfigError, typed, unknown_key_message
from protocol import tls
from protocol.errors import InvalidConfigError
from storage import errors as storage_errors
from storage.config import LogConfig

logger = logging.getLogger(__name__)

BROKER_ROLE = "broker"
CONTROLLER_ROLE = "controller"
BROKER_LISTENER = "BROKER"
CONTROLLER_LISTENER = "CONTROLLER"
#: Kafka's binary protocol (api/broker/kafka_listener.py), on brokers.
KAFKA_LISTENER = "KAFKA"
#: metadata.log.dir's default, inside the first log dir (not a partition name,
#: so the log manager passes it by).
METADATA_DIR_NAME = "__cluster_metadata"

@dataclasses.dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    tls: bool = False  # the listener speaks SSL (listener.security.protocol.map)
    sasl: bool = False  # SASL_SSL: a request needs a certificate or a SCRAM user

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    @property
    def registered(self) -> str:
        """How a broker names it in its registration: ``host:port``, or
        its ``https://`` URL for an SSL listener (so whoever learns it from
        metadata knows to connect with TLS)."""
        return self.url if self.tls else str(self)


@dataclasses.dataclass(eq=False)
class NodeTls:
    """The TLS a node speaks: its SSL listeners' context (one, shared by
    the listeners the protocol map says are SSL) and the context it calls
    its peers' SSL listeners with (trusting ssl.cafile, presenting its
    certificate where asked). Built once, at config load, so a bad file
    stops the node before it binds anything."""

    server: ssl.SSLContext
    peer: ssl.SSLContext
    reloader: tls.CertificateReloader
    reload_interval_ms: int
    #: ssl.principal.mapping.rules: client certificate subject -> user name.
    mapper: tls.PrincipalMapper
    #: Some listener is SASL_SSL: then every SSL listener requires a client
    #: certificate (no listener of such a cluster serves anonymous clients).
    sasl: bool


@dataclasses.dataclass(frozen=True)
class NodeConfig:
    """What a node is and how its control plane behaves. Units in names."""

    node_id: int                               # node.id
    roles: frozenset[str]                      # process.roles
    voters: Mapping[int, Endpoint]             # controller.quorum.voters (HTTP)
    listeners: Mapping[str, Endpoint]          # listeners: name -> endpoint
    metadata_log_dir: str                      # metadata.log.dir (see METADATA_DIR_NAME)
    rack: str | None                           # broker.rack
    # Broker leases (Kafka: 9000 / 2000).
    session_timeout_ms: int                    # broker.session.timeout.ms
    heartbeat_interval_ms: int                 # broker.heartbeat.interval.ms
    # Raft timing: a follower that hears nothing from the leader for a random
    # time in [election, 2 * election) starts an election; a leader that hears
    # from no majority for fetch_timeout_ms steps down.
    election_timeout_ms: int                   # controller.quorum.election.timeout.ms
    fetch_timeout_ms: int                      # controller.quorum.fetch.timeout.ms
    raft_port_offset: int                      # controller.quorum.raft.port.offset
    # Topic defaults and leadership policy.
    num_partitions: int                        # num.partitions
    default_replication_factor: int            # default.replication.factor
    unclean_leader_election_enable: bool       # unclean.leader.election.enable
    auto_leader_rebalance_enable: bool         # auto.leader.rebalance.enable
    leader_imbalance_check_interval_ms: int    # leader.imbalance.check.interval.seconds
    # A deliberately broken broker for the chaos checker's self-test: acks=all
    # is answered as soon as the leader has appended (as acks=1), with no
    # min.insync.replicas check. Never set it anywhere else.
    unsafe_ack_before_replication: bool = False  # unsafe.ack.before.replication
    # The controllers' shared Raft secret, read from controller.quorum.secret.file
    # (never in settings, so --print-config cannot show it); None: none set.
    raft_secret: bytes | None = dataclasses.field(default=None, repr=False)
    # TLS contexts, when a listener is SSL (listener.security.protocol.map).
    tls: NodeTls | None = dataclasses.field(default=None, repr=False, compare=False)
    # The key delegation tokens' HMACs are made with, read from
    # delegation.token.secret.key.file (None: no tokens on this cluster).
    token_secret: bytes | None = dataclasses.field(default=None, repr=False)
    # The authorizer's settings (authorizer.class.name, super.users, ...).
    acl: AclSettings = dataclasses.field(default_factory=AclSettings)
    # Every key of the schema that has a value (set, or a default), typed.
    settings: Mapping[str, Any] = dataclasses.field(default_factory=dict, repr=False)
    # Where each key's value came from: "default", the file's path, or "--set".
    sources: Mapping[str, str] = dataclasses.field(default_factory=dict, repr=False)

    @property
    def is_controller(self) -> bool:
        return CONTROLLER_ROLE in self.roles

    @property
    def is_broker(self) -> bool:
        return BROKER_ROLE in self.roles

    def secure_app(self, app: Any, endpoint: Endpoint,
                   credentials: Callable[[str], Mapping[str, str]] | None = None,
                   ready: Callable[[], bool] = lambda: True,
                   tokens: Callable[[str], Any] | None = None) -> None:
        """What an HTTP app served on ``endpoint`` needs for TLS: each
        request's user named from its client certificate, and refused
        without one where ``ssl.client.auth = required``; on a SASL_SSL
        listener, without a certificate, from a SCRAM user's name and
        password (``credentials``: user -> mechanism -> encoded credential,
        from the metadata; ``ready``: whether that metadata has caught up), or
        a delegation token (``tokens``: token id -> ``TokenInfo``, its HMAC
        checked with ``token_secret``)."""
        if endpoint.tls and self.tls is not None:
            if endpoint.sasl and credentials is None:
                raise RuntimeError(f"the SASL_SSL listener {endpoint} needs the users' "
                                   "credentials to check passwords against")
            verifier = tls.PasswordVerifier(credentials, ready, tokens, self.token_secret) \
                if endpoint.sasl else None
            required = self.settings.get("ssl.client.auth") == "required" or self.tls.sasl
            tls.authenticate_clients(app, self.tls.mapper, required and not endpoint.sasl,
                                     verifier)

    def raft_endpoint(self, node_id: int) -> Endpoint:
        voter = self.voters[node_id]
        return Endpoint(voter.host, voter.port + self.raft_port_offset)

    @property
    def joins_quorum(self) -> bool:
        """A controller started to join the quorum (controller.quorum.join)
        whose id the static voters do not name."""
        return self.is_controller and self.node_id not in self.voters \
            and bool(self.settings.get("controller.quorum.join"))

    @property
    def controller_endpoint(self) -> Endpoint:
        """This controller's CONTROLLER listener (its voter address)."""
        return self.listeners[CONTROLLER_LISTENER]

    @property
    def own_raft_endpoint(self) -> Endpoint:
        own = self.controller_endpoint
        return Endpoint(own.host, own.port + self.raft_port_offset)

    @property
    def cluster_id(self) -> str:
        """``cluster.id`` if set; otherwise one derived from the voter set, so
        every node of a cluster reports the same id without coordination."""
        configured = self.settings.get("cluster.id")
        if configured:
            return str(configured)
        voters = ",".join(f"{nid}@{ep}" for nid, ep in sorted(self.voters.items()))
        digest = hashlib.sha256(voters.encode()).digest()[:16]
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")

    @property
    def controller_urls(self) -> dict[int, str]:
        return {node_id: endpoint.url for node_id, endpoint in sorted(self.voters.items())}


#: Every key a node accepts (the schema's).
KNOWN_KEYS = frozenset(BY_NAME)


def load_node_config(path: str, overrides: Iterable[str] = ()) -> NodeConfig:
    """Read a TOML config file and apply ``key=value`` overrides."""
    try:
        with open(path, "rb") as f:
            settings = tomllib.load(f)
    except FileNotFoundError:
        raise InvalidConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidConfigError(f"config file {path} is not valid TOML: {exc}") from None
    sources = {key: path for key in settings}
    for key in settings:
        if key not in BY_NAME:
            raise InvalidConfigError(unknown_key_message(key, path))
    for override in overrides:
        key, sep, value = override.partition("=")
        if not sep or not key.strip():
            raise InvalidConfigError(f"override {override!r} must look like key=value")
        if key.strip() not in BY_NAME:
            raise InvalidConfigError(unknown_key_message(key.strip(), "--set"))
        settings[key.strip()] = parse_override(value.strip())
        sources[key.strip()] = "--set"
    return node_config_from_settings(settings, sources)


def parse_connection_overrides(text: str) -> dict[str, int]:
    """``max.connections.per.ip.overrides``: ``"address:count,..."`` as a
    dict (api/broker/connections.py applies it)."""
    overrides: dict[str, int] = {}
    for item in (part.strip() for part in (text or "").split(",")):
        if not item:
            continue
        host, sep, count = item.rpartition(":")
        host = host.strip().strip("[]")
        value = int(count) if count.strip().isascii() and count.strip().isdigit() else -1
        if not sep or not host or value < 0:
            raise InvalidConfigError(
                f"max.connections.per.ip.overrides: {item!r} is not '<address>:<count>' "
                "with a count of 0 or more (for example '10.0.0.5:500,127.0.0.1:2000')")
        overrides[host] = value
    return overrides


def node_config_from_settings(settings: Mapping[str, Any],
                              sources: Mapping[str, str] | None = None) -> NodeConfig:
    """A ``NodeConfig`` from raw ``settings`` (as TOML gives them)."""
    for key in settings:
        if key not in BY_NAME:
            raise InvalidConfigError(unknown_key_message(key, "the node settings"))
    sources = dict(sources or {})
    values: dict[str, Any] = {}
    for key in SCHEMA:
        raw = settings.get(key.name)
        if raw is None:  # given as None (from Python; TOML has no null): not set
            raw = key.default
        try:
            values[key.name] = typed(key, raw)
        except ConfigError as exc:
            where = sources.get(key.name)
            raise InvalidConfigError(f"{exc}{f' (in {where})' if where else ''}") from None
        sources.setdefault(key.name, "settings" if key.name in settings else "default")
    node_id = values["node.id"]
    if node_id is None:
        raise InvalidConfigError("node.id must be set to a non-negative integer")
    roles = parse_roles(values["process.roles"])
    parse_connection_overrides(values["max.connections.per.ip.overrides"])  # refused early
    listeners = parse_listeners(values["listeners"] or "")
    voters = parse_voters(values["controller.quorum.voters"] or "")
    protocols = parse_protocol_map(values["listener.security.protocol.map"], listeners)
    listeners = {name: _speaking(ep, protocols.get(name)) for name, ep in listeners.items()}
    voters = {node: _speaking(ep, protocols.get(CONTROLLER_LISTENER))
              for node, ep in voters.items()}
    log_dirs = values["log.dirs"] if values["log.dirs"] is not None else values["log.dir"]
    if isinstance(log_dirs, str):
        log_dirs = [d.strip() for d in log_dirs.split(",") if d.strip()]
    metadata_dir = values["metadata.log.dir"] or (
        os.path.join(log_dirs[0], METADATA_DIR_NAME) if log_dirs else None)
    if not metadata_dir:
        raise InvalidConfigError("set metadata.log.dir or log.dirs: metadata needs a directory")
    config = NodeConfig(
        node_id=node_id,
        roles=roles,
        voters=voters,
        listeners=listeners,
        metadata_log_dir=metadata_dir,
        rack=values["broker.rack"],
        session_timeout_ms=values["broker.session.timeout.ms"],
        heartbeat_interval_ms=values["broker.heartbeat.interval.ms"],
        election_timeout_ms=values["controller.quorum.election.timeout.ms"],
        fetch_timeout_ms=values["controller.quorum.fetch.timeout.ms"],
        raft_port_offset=values["controller.quorum.raft.port.offset"],
        num_partitions=values["num.partitions"],
        default_replication_factor=values["default.replication.factor"],
        unclean_leader_election_enable=values["unclean.leader.election.enable"],
        auto_leader_rebalance_enable=values["auto.leader.rebalance.enable"],
        leader_imbalance_check_interval_ms=values["leader.imbalance.check.interval.seconds"] * 1000,
        unsafe_ack_before_replication=values["unsafe.ack.before.replication"],
        raft_secret=_read_raft_secret(values["controller.quorum.secret.file"]),
        tls=_node_tls(values, protocols),
        acl=_acl_settings(values),
        token_secret=_read_raft_secret(values["delegation.token.secret.key.file"],
                                       "delegation.token.secret.key.file"),
        settings={key: value for key, value in values.items() if value is not None},
        sources=sources,
    )
    _check(config)
    return config


def _speaking(endpoint: Endpoint, protocol: str | None) -> Endpoint:
    """``endpoint`` as a listener of ``protocol`` serves it."""
    return dataclasses.replace(endpoint, tls=protocol in tls.TLS_PROTOCOLS,
                               sasl=protocol == tls.SASL_SSL)


def parse_protocol_map(text: str, listeners: Mapping[str, Endpoint]) -> dict[str, str]:
    """``BROKER:SSL,CONTROLLER:PLAINTEXT`` -> {listener: protocol}."""
    protocols: dict[str, str] = {}
    for item in (i.strip() for i in text.split(",") if i.strip()):
        name, sep, protocol = item.partition(":")
        protocol = protocol.strip().upper()
        if not sep or not name.strip():
            raise InvalidConfigError(
                f"listener.security.protocol.map: {item!r} is not NAME:PROTOCOL")
        if protocol == tls.SASL_PLAINTEXT:
            raise InvalidConfigError(
                f"listener.security.protocol.map: {name} = SASL_PLAINTEXT would send "
                "passwords in clear: use SASL_SSL (TLS, then a SCRAM user's name and "
                "password, or a client certificate)")
        if protocol == tls.SASL_SSL and name.strip() == CONTROLLER_LISTENER:
            raise InvalidConfigError(
                "listener.security.protocol.map: CONTROLLER = SASL_SSL: the controllers serve "
                "nodes and administrators, who authenticate with certificates: use "
                "CONTROLLER:SSL (a cluster with SASL_SSL listeners requires client "
                "certificates on its SSL listeners)")
        if protocol not in tls.SECURITY_PROTOCOLS:
            raise InvalidConfigError(
                f"listener.security.protocol.map: {name} = {protocol!r}: use "
                f"{' or '.join(tls.SECURITY_PROTOCOLS)}")
        protocols[name.strip()] = protocol
    for name in listeners:
        if name not in protocols:
            raise InvalidConfigError(
                f"listener {name} has no entry in listener.security.protocol.map "
                f"({text!r}): add {name}:PLAINTEXT or {name}:SSL")
    for name in protocols:
        if name not in (BROKER_LISTENER, CONTROLLER_LISTENER, KAFKA_LISTENER):
            raise InvalidConfigError(
                f"listener.security.protocol.map names {name!r}: kraftlog's listeners are "
                f"{BROKER_LISTENER}, {CONTROLLER_LISTENER} and {KAFKA_LISTENER}")
    if tls.SASL_SSL in protocols.values():
        # Every node must know the cluster has password users (its SSL
        # listeners then require certificates), and none may serve plainly.
        missing = [n for n in (BROKER_LISTENER, CONTROLLER_LISTENER) if n not in protocols]
        plain = [n for n, p in protocols.items() if p == tls.PLAINTEXT]
        if missing or plain:
            raise InvalidConfigError(
                "listener.security.protocol.map: with a SASL_SSL listener, map both "
                f"{BROKER_LISTENER} and {CONTROLLER_LISTENER} (the same on every node) and "
                "none as PLAINTEXT, e.g. BROKER:SASL_SSL,CONTROLLER:SSL")
    if CONTROLLER_LISTENER in listeners and BROKER_LISTENER not in protocols:
        raise InvalidConfigError(
            "listener.security.protocol.map: a controller maps BROKER too (the same map on "
            "every node): it decides how this controller's clients must authenticate")
    return protocols


def _node_tls(values: Mapping[str, Any], protocols: Mapping[str, str]) -> NodeTls | None:
    """The node's TLS contexts, or None when nothing it serves or calls is SSL."""
    if not set(protocols.values()) & set(tls.TLS_PROTOCOLS):
        for key, default in (("ssl.client.auth", "none"),
                             ("ssl.principal.mapping.rules", "DEFAULT")):
            if values[key] != default:
                raise InvalidConfigError(
                    f"{key} = {values[key]!r} has no effect: no listener is SSL in "
                    "listener.security.protocol.map (set e.g. BROKER:SSL,CONTROLLER:SSL)")
        return None
    certfile, keyfile = values["ssl.certfile"], values["ssl.keyfile"]
    cafile, client_auth = values["ssl.cafile"], values["ssl.client.auth"]
    identification = values["ssl.endpoint.identification.algorithm"]
    if not certfile:
        ssl_listeners = ", ".join(n for n, p in protocols.items() if p in tls.TLS_PROTOCOLS)
        raise InvalidConfigError(
            f"listener(s) {ssl_listeners} are SSL: set ssl.certfile and ssl.keyfile (PEM; "
            "`kraftlog certs create --dir certs` makes a CA and node certificates)")
    if identification not in ("https", ""):
        raise InvalidConfigError(
            f"ssl.endpoint.identification.algorithm = {identification!r}: use https or ''")
    if tls.SASL_SSL in protocols.values() and client_auth == "none":
        # A SASL_SSL listener takes a client certificate instead of a password
        # (the nodes' own calls): the context asks for one, without insisting.
        if not cafile:
            raise InvalidConfigError(
                "a SASL_SSL listener accepts client certificates too (the nodes call each "
                "other with theirs): set ssl.cafile to the CA that signs them")
        client_auth = "requested"
    try:
        server = tls.server_context(certfile, keyfile, cafile, client_auth)
        peer = tls.client_context(cafile, certfile, keyfile,
                                  check_hostname=identification == "https")
        mapper = tls.PrincipalMapper(values["ssl.principal.mapping.rules"])
    except tls.TlsConfigError as exc:
        raise InvalidConfigError(str(exc)) from None
    return NodeTls(server, peer, tls.CertificateReloader(server, peer, certfile, keyfile, cafile),
                   values["ssl.reload.interval.ms"], mapper,
                   sasl=tls.SASL_SSL in protocols.values())


#: The shortest controller.quorum.secret.file content accepted.
RAFT_SECRET_CHARS_MIN = 16


def _read_raft_secret(path: str | None, key: str = "controller.quorum.secret.file"
                      ) -> bytes | None:
    """A secret from the file ``key`` names (None: no file set)."""
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            secret = f.read().strip()
    except OSError as exc:
        raise InvalidConfigError(f"{key} {path!r} cannot be read: {exc.strerror}") from None
    if len(secret) < RAFT_SECRET_CHARS_MIN:
        raise InvalidConfigError(
            f"{key} {path!r} holds {len(secret)} characters; use at least "
            f"{RAFT_SECRET_CHARS_MIN} (for example: head -c 32 /dev/urandom | base64)")
    return secret


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable only from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def print_config(config: NodeConfig) -> str:
    """The effective config as an aligned table: key, value, where from."""
    rows = [("KEY", "VALUE", "FROM")]
    for key in SCHEMA:
        value = config.settings.get(key.name)
        shown = "(not set)" if value is None else (
            str(value).lower() if isinstance(value, bool) else str(value))
        rows.append((key.name, shown, config.sources.get(key.name, "default")))
    widths = [max(len(row[i]) for row in rows) for i in range(2)]
    return "\n".join(f"{k:<{widths[0]}}  {v:<{widths[1]}}  {src}" for k, v, src in rows)


def parse_roles(text: str) -> frozenset[str]:
    roles = frozenset(r.strip() for r in text.split(",") if r.strip())
    if not roles or not roles <= {BROKER_ROLE, CONTROLLER_ROLE}:
        raise InvalidConfigError(
            f"process.roles = {text!r}: use 'broker', 'controller' or 'broker,controller'")
    return roles


def parse_endpoint(text: str, what: str) -> Endpoint:
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidConfigError(f"{what}: {text!r} is not host:port")
    return Endpoint(host.strip("[]"), int(port))


def parse_listeners(text: str) -> dict[str, Endpoint]:
    """``BROKER://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093``."""
    listeners = {}
    for item in (i.strip() for i in text.split(",") if i.strip()):
        name, sep, address = item.partition("://")
        if not sep or not name:
            raise InvalidConfigError(f"listeners: {item!r} is not NAME://host:port")
        if name in listeners:
            raise InvalidConfigError(f"listeners: {name} is given twice")
        listeners[name] = parse_endpoint(address, f"listener {name}")
    return listeners


def parse_voters(text: str) -> dict[int, Endpoint]:
    """``1@127.0.0.1:9093,2@127.0.0.1:9193``."""
    voters = {}
    for item in (i.strip() for i in text.split(",") if i.strip()):
        node_id, sep, address = item.partition("@")
        if not sep or not node_id.isdigit():
            raise InvalidConfigError(
                f"controller.quorum.voters: {item!r} is not id@host:port")
        if int(node_id) in voters:
            raise InvalidConfigError(f"controller.quorum.voters: id {node_id} is given twice")
        voters[int(node_id)] = parse_endpoint(address, f"voter {node_id}")
    if not voters:
        raise InvalidConfigError("controller.quorum.voters must name at least one controller")
    return voters


def _acl_settings(values: Mapping[str, Any]) -> AclSettings:
    name = values["authorizer.class.name"]
    if name and name not in AUTHORIZER_NAMES:
        raise InvalidConfigError(
            f"authorizer.class.name = {name!r}: use {STANDARD_AUTHORIZER} (ACLs on) or leave "
            "it empty (off)")
    settings = AclSettings.from_settings(values)
    for user in settings.super_users:
        if not user.startswith("User:") or len(user) == len("User:"):
            raise InvalidConfigError(
                f"super.users: {user!r} is not a principal: User:<name>, ';'-separated")
    return settings


def _check(config: NodeConfig) -> None:
    if config.is_controller:
        own = config.voters.get(config.node_id)
        if own is None and not config.joins_quorum:
            raise InvalidConfigError(
                f"node {config.node_id} has the controller role but is not in "
                "controller.quorum.voters (a new controller joining a running quorum: set "
                "controller.quorum.join = true, then run kraftlog quorum add-controller)")
        if own is None and CONTROLLER_LISTENER not in config.listeners:
            raise InvalidConfigError("a controller needs a CONTROLLER://host:port listener")
        own = own or config.controller_endpoint
        raft = Endpoint(own.host, own.port + config.raft_port_offset)
        if config.raft_secret is None and not is_loopback(raft.host):
            raise InvalidConfigError(
                f"the Raft port {raft} is reachable from other machines, and Raft messages "
                "are Python pickles: a peer that can reach it could run code on this "
                "controller. Set controller.quorum.secret.file to a file with a shared "
                "secret (the same on every controller; e.g. head -c 32 /dev/urandom | base64 "
                "> secret), or keep every voter on loopback")
        listener = config.listeners.get(CONTROLLER_LISTENER)
        if listener != own:
            raise InvalidConfigError(
                f"the CONTROLLER listener ({listener}) must be this node's voter address ({own})")
    if config.is_broker and BROKER_LISTENER not in config.listeners:
        raise InvalidConfigError("a broker needs a BROKER://host:port listener")
    kafka = config.listeners.get(KAFKA_LISTENER)
    if kafka is not None:
        if not config.is_broker:
            raise InvalidConfigError("the KAFKA listener (Kafka's protocol) is a broker's: "
                                     "this node has no broker role")
    plain = sorted(name for name, ep in config.listeners.items() if not ep.tls)
    if config.acl.enabled and plain and tls.ANONYMOUS not in config.acl.super_users:
        raise InvalidConfigError(
            f"authorizer.class.name is set but listener(s) {', '.join(plain)} are PLAINTEXT: "
            f"every caller there, the other nodes included, is {tls.ANONYMOUS}, whom no ACL "
            "can tell apart. Make them SSL or SASL_SSL (kraftlog cluster up --secure sets "
            f"this up), or add {tls.ANONYMOUS} to super.users")
    positive = {
        "broker.session.timeout.ms": config.session_timeout_ms,
        "broker.heartbeat.interval.ms": config.heartbeat_interval_ms,
        "controller.quorum.election.timeout.ms": config.election_timeout_ms,
        "controller.quorum.fetch.timeout.ms": config.fetch_timeout_ms,
        "num.partitions": config.num_partitions,
        "default.replication.factor": config.default_replication_factor,
        "leader.imbalance.check.interval.seconds": config.leader_imbalance_check_interval_ms,
    }
    for key, value in positive.items():
        if value < 1:
            raise InvalidConfigError(f"{key} must be at least 1, not {value}")
    if config.heartbeat_interval_ms >= config.session_timeout_ms:
        raise InvalidConfigError(
            "broker.heartbeat.interval.ms must be below broker.session.timeout.ms "
            f"({config.heartbeat_interval_ms} >= {config.session_timeout_ms})")
    if config.fetch_timeout_ms >= config.session_timeout_ms:
        # A deposed leader that has not noticed yet may renew leases for up to
        # the fetch timeout; those must not outlive a broker's session.
        raise InvalidConfigError(
            "controller.quorum.fetch.timeout.ms must be below broker.session.timeout.ms "
            f"({config.fetch_timeout_ms} >= {config.session_timeout_ms})")
    if config.fetch_timeout_ms < config.election_timeout_ms:
        raise InvalidConfigError(
            "controller.quorum.fetch.timeout.ms must be at least "
            "controller.quorum.election.timeout.ms")
    if not 1 <= config.raft_port_offset < 65535:
        raise InvalidConfigError("controller.quorum.raft.port.offset must be between 1 and 65534")
    # The log.* keys are the topics' defaults: checked together as a log
    # combines them (cleanup.policy's words, max.compaction.lag.ms at least
    # min.compaction.lag.ms), so a bad one stops the node here, not when it
    # first opens a partition.
    try:
        LogConfig.from_broker_config(config.settings)
    except storage_errors.InvalidConfigError as exc:
        raise InvalidConfigError(f"the node's log settings make a bad topic default: {exc}"
                                 ) from None
    for node_id, voter in config.voters.items():
        if voter.port + config.raft_port_offset > 65535:
            raise InvalidConfigError(f"voter {node_id}: Raft port {voter.port} + offset "
                                     f"{config.raft_port_offset} is above 65535")


def parse_override(value: str) -> Any:
    """``--set key=value``: TOML's reading of the value when it has one
    (numbers, booleans, quoted strings), else the text itself."""
    try:
        return tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        return value

