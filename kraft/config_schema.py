"""Every node config key, declared once: name, type, default, range, doc.

A node's TOML file (and ``--set key=value``) may name only these keys;
anything else is refused at start-up with the nearest valid name. Each key
says which module reads it (``read_by``); ``tests/unit/test_config_schema.py``
checks that module really reads it, so no key is accepted and then silently
ignored. Values are checked here once (type, range, choices) and handed to
the components typed; ``kraftlog node --print-config`` shows the effective
value of each and where it came from, and ``docs/config.md`` is rendered
from this table (``render_markdown``).

A default of ``None`` means "not set": the component's own rule applies (the
log's defaults for the ``log.*`` keys, whose finest unit wins, as in Kafka;
``metadata.log.dir`` under the first log dir). No key is dynamic yet: a
change takes a restart. Topic-level overrides (``retention.ms`` and friends,
set per topic through the admin API) are a separate registry,
``kraft/topic_config.py``; the ``log.*`` keys here are their node defaults.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from typing import Any

from storage.config import LogConfig

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
#: How a limit of "none" is spelled by Kafka's size and time settings.
NO_LIMIT = -1

_LOG_DEFAULTS = LogConfig()


@dataclasses.dataclass(frozen=True)
class Key:
    name: str
    # "int", "float", "bool", "str" or "dirs" (a list or comma-separated string)
    type: str
    default: Any
    doc: str
    read_by: str  # the module that reads it, relative to the repository
    min: int | float | None = None  # inclusive bounds, for "int" and "float" keys
    max: int | float | None = None
    dynamic: bool = False

    def describe_range(self) -> str:
        if self.type not in ("int", "float"):
            return ""
        low = "" if self.min is None else str(self.min)
        high = "" if self.max is None else str(self.max)
        return f"[{low}, {high}]" if self.min is not None or self.max is not None else ""


def _k(name, type_, default, doc, read_by, low=None, high=None) -> Key:
    return Key(name, type_, default, doc, read_by, low, high)


_CONFIG = "kraft/config.py"
_AUTHORIZER = "kraft/authorizer.py"
_TOPIC = "kraft/topic_config.py"
_STORAGE = "storage/config.py"
_MANAGER = "storage/manager.py"
_BROKER = "api/broker/server.py"
_GROUPS = "api/broker/groups/service.py"
_TXNS = "api/broker/transactions/service.py"
_CLEANER = "storage/cleaner.py"
_CONNECTIONS = "api/broker/connections.py"

SCHEMA: tuple[Key, ...] = (
    # -- identity and the control plane ---------------------------------------------------
    _k("node.id", "int", None, "This node's id, unique in the cluster (required).",
       _CONFIG, 0, INT32_MAX),
    _k("process.roles", "str", "broker,controller",
       "What this node runs: broker, controller, or both (combined).", _CONFIG),
    _k("controller.quorum.voters", "str", None,
       "Every controller as id@host:port of its CONTROLLER listener (required).", _CONFIG),
    _k("listeners", "str", None,
       "NAME://host:port per listener: BROKER (data plane, HTTP), CONTROLLER "
       "(controllers), KAFKA (brokers: Kafka's binary protocol, for Kafka clients).",
       _CONFIG),
    _k("metadata.log.dir", "str", None,
       "Where a controller keeps its Raft journal and snapshots (default: "
       "__cluster_metadata under the first log dir).", _CONFIG),
    _k("cluster.id", "str", None,
       "The cluster's id (default: derived from controller.quorum.voters, so "
       "set it before changing the voters).", _CONFIG),
    _k("broker.rack", "str", None, "This broker's rack, for rack-aware replica placement.",
       _CONFIG),
    _k("broker.session.timeout.ms", "int", 9000,
       "A broker not heard from for this long is fenced and loses its leaderships. "
       "One whose process is gone (its connection to the active controller closed "
       "and not reopened within 500 ms) is fenced at once; this timeout is for one "
       "that is hung or cut off.",
       _CONFIG, 1, INT32_MAX),
    _k("broker.heartbeat.interval.ms", "int", 2000,
       "How often a broker heartbeats (below the session timeout).", _CONFIG, 1, INT32_MAX),
    _k("controller.quorum.election.timeout.ms", "int", 500,
       "A controller that hears no leader for this long (to twice it) asks the voters for a "
       "pre-vote, and stands for election if a majority no longer hears a leader either.",
       _CONFIG, 1, INT32_MAX),
    _k("controller.quorum.fetch.timeout.ms", "int", 2000,
       "A Raft leader that hears from no majority for this long steps down.", _CONFIG, 1,
       INT32_MAX),
    _k("controller.quorum.raft.port.offset", "int", 1,
       "The Raft port is the CONTROLLER port plus this.", _CONFIG, 1, 65534),
    _k("controller.quorum.join", "bool", False,
       "Start a controller whose node.id is not in controller.quorum.voters (list the "
       "current voters there): it follows the quorum as an observer and votes once "
       "`kraftlog quorum add-controller` adds it. The log's voter set, not "
       "controller.quorum.voters, decides who votes once membership has changed.",
       _CONFIG),
    _k("controller.quorum.secret.file", "str", None,
       "A file holding the controllers' shared secret (at least 16 characters, the same "
       "file content on every controller). Raft messages are authenticated and encrypted "
       "with it (Fernet) before anything in them is read; required when a Raft port is not "
       "on loopback. A lone controller without one makes up its own.", _CONFIG),
    _k("listener.security.protocol.map", "str",
       "BROKER:PLAINTEXT,CONTROLLER:PLAINTEXT,KAFKA:PLAINTEXT",
       "NAME:PROTOCOL per listener, PROTOCOL PLAINTEXT, SSL (TLS with ssl.certfile) or "
       "SASL_SSL (TLS, and clients log in as SCRAM users: BROKER and KAFKA only). "
       "Every node of a cluster must map the listeners alike: peers are called with the "
       "protocol this node maps them to.", _CONFIG),
    _k("ssl.certfile", "str", None,
       "PEM certificate (chain) the SSL listeners present, and this node presents to peers "
       "that ask for one.", _CONFIG),
    _k("ssl.keyfile", "str", None, "PEM private key of ssl.certfile (unencrypted).", _CONFIG),
    _k("ssl.cafile", "str", None,
       "PEM CA certificates this node trusts: for its peers' certificates, and for "
       "clients' certificates when ssl.client.auth asks for them (default: the system's "
       "CAs for peers).", _CONFIG),
    _k("ssl.client.auth", "str", "none",
       "none, requested or required: whether SSL listeners ask clients for a certificate "
       "signed by ssl.cafile (required: a client without one is refused).", _CONFIG),
    _k("ssl.endpoint.identification.algorithm", "str", "https",
       "https: check that a peer's certificate names the host this node called; empty: "
       "do not (certificates without the right names, in a test setup).", _CONFIG),
    _k("ssl.principal.mapping.rules", "str", "DEFAULT",
       "How a client certificate's subject (CN=etl,OU=data,O=acme) becomes its user name "
       "(User:<name>, for quotas): RULE:pattern/replacement/[L|U] rules and DEFAULT (the "
       "subject as it is), comma-separated, first match wins; a subject no rule matches is "
       "refused. Kafka's syntax.", _CONFIG),
    _k("delegation.token.secret.key.file", "str", "",
       "A file holding the key delegation tokens' HMACs are made with (at least 16 "
       "characters, the same on every node). Kafka's delegation.token.secret.key, kept out "
       "of the config file. Empty: the cluster makes no tokens.", _CONFIG),
    _k("delegation.token.expiry.time.ms", "int", 86_400_000,
       "How long a delegation token lasts unless renewed (a renewal pushes its expiry this "
       "far, by default).", "kraft/controller.py", 1, INT64_MAX),
    _k("delegation.token.max.lifetime.ms", "int", 604_800_000,
       "No renewal takes a delegation token past this long after it was made.",
       "kraft/controller.py", 1, INT64_MAX),
    _k("authorizer.class.name", "str", "",
       "Turns ACLs on: kraftlog.StandardAuthorizer (or Kafka's "
       "org.apache.kafka.metadata.authorizer.StandardAuthorizer, the same thing). Empty: "
       "off, every authenticated caller may do anything.", _CONFIG),
    _k("super.users", "str", "",
       "Principals that ACLs do not restrict, ';'-separated (certificate subjects hold "
       "commas): User:CN=node-1;User:admin. The nodes' own certificate principals belong "
       "here.", _AUTHORIZER),
    _k("allow.everyone.if.no.acl.found", "bool", False,
       "With the authorizer on: whether a resource that no ACL names is open to everyone "
       "(Kafka's default, false: closed).", _AUTHORIZER),
    _k("ssl.reload.interval.ms", "int", 30_000,
       "How often SSL listeners look for a changed ssl.certfile, ssl.keyfile or ssl.cafile "
       "and load it: new connections get the new certificate, without a restart.",
       _CONFIG, 100, INT32_MAX),
    _k("num.partitions", "int", 1, "Partitions of a topic created without a count.",
       _CONFIG, 1, 1_000_000),
    _k("default.replication.factor", "int", 1,
       "Replicas of a topic created without a replication factor.", _CONFIG, 1, 1000),
    _k("unclean.leader.election.enable", "bool", False,
       "Elect a leader outside the ISR when none is left (accepts data loss).", _CONFIG),
    _k("eligible.leader.replicas.enable", "bool", True,
       "Track eligible leader replicas (Kafka's KIP-966): a replica that leaves the ISR "
       "while it is below min.insync.replicas may still be elected, and one that restarts "
       "after an unclean shutdown may not, while a clean one is left. Off on the "
       "controllers while upgrading from a version without it (that version cannot read "
       "the records it writes).", "kraft/controller.py"),
    _k("auto.leader.rebalance.enable", "bool", True,
       "Move leadership back to preferred replicas periodically.", _CONFIG),
    _k("leader.imbalance.check.interval.seconds", "int", 300,
       "How often preferred leaders are checked.", _CONFIG, 1, INT32_MAX),
    _k("min.insync.replicas", "int", 1,
       "Default for topics: fewest in-sync replicas an acks=all write needs; below it the "
       "high watermark stops moving too (KIP-966). Keep it equal on every node.", _TOPIC, 1,
       1000),
    _k("unsafe.ack.before.replication", "bool", False,
       "UNSAFE, for the chaos checker's self-test only: answer acks=all before replication.",
       _CONFIG),
    # -- storage ----------------------------------------------------------------------------
    _k("log.dirs", "dirs", None, "Directories holding partition logs, comma-separated.",
       _MANAGER),
    _k("log.dir", "dirs", None, "One log directory (log.dirs wins when both are set).",
       _MANAGER),
    _k("log.segment.bytes", "int", None,
       f"Roll a segment at this size (default {_LOG_DEFAULTS.segment_bytes}).", _STORAGE,
       1024, INT32_MAX),
    _k("log.roll.ms", "int", None, "Roll a segment this old (default 7 days).", _STORAGE,
       1, INT64_MAX),
    _k("log.roll.hours", "int", None, "log.roll.ms in hours.", _STORAGE, 1, INT32_MAX),
    _k("log.index.interval.bytes", "int", None,
       f"Bytes between index entries (default {_LOG_DEFAULTS.index_interval_bytes}).",
       _STORAGE, 0, INT32_MAX),
    _k("log.retention.ms", "int", None,
       "Delete segments older than this; -1 keeps them (default 7 days).", _STORAGE,
       NO_LIMIT, INT64_MAX),
    _k("log.retention.minutes", "int", None, "log.retention.ms in minutes.", _STORAGE,
       NO_LIMIT, INT32_MAX),
    _k("log.retention.hours", "int", None, "log.retention.ms in hours.", _STORAGE,
       NO_LIMIT, INT32_MAX),
    _k("log.retention.bytes", "int", None,
       "Delete old segments past this size per partition; -1: no limit.", _STORAGE,
       NO_LIMIT, INT64_MAX),
    _k("log.flush.interval.messages", "int", None,
       "fsync inside the append that brings the unflushed records to this many (1: every "
       "write is on disk before it is acknowledged or fetched, docs/durability.md); -1: no "
       "limit.", _STORAGE, NO_LIMIT, INT64_MAX),
    _k("log.flush.interval.ms", "int", None,
       f"fsync data at most this old (default {_LOG_DEFAULTS.flush_ms} ms); -1: never "
       "by time.", _STORAGE, NO_LIMIT, INT64_MAX),
    _k("message.max.bytes", "int", None,
       f"Largest record batch accepted (default {_LOG_DEFAULTS.max_message_bytes}).",
       _STORAGE, 61, INT32_MAX),
    _k("log.cleanup.policy", "str", _LOG_DEFAULTS.cleanup_policy,
       "Default cleanup.policy of topics: delete (retention removes old segments), compact "
       "(keep the newest record of each key; a null value deletes the key) or compact,delete "
       "(both; delete,compact and any case are accepted too).", _STORAGE),
    _k("log.cleaner.min.cleanable.ratio", "float", _LOG_DEFAULTS.min_cleanable_dirty_ratio,
       "Default min.cleanable.dirty.ratio: compact a log once this fraction of it has not "
       "been compacted yet.", _STORAGE, 0, 1),
    _k("log.cleaner.min.compaction.lag.ms", "int", _LOG_DEFAULTS.min_compaction_lag_ms,
       "Default min.compaction.lag.ms: a record stays uncompacted at least this long.",
       _STORAGE, 0, INT64_MAX),
    _k("log.cleaner.max.compaction.lag.ms", "int", _LOG_DEFAULTS.max_compaction_lag_ms,
       "Default max.compaction.lag.ms: a record is compacted within this long, whatever the "
       "dirty ratio (at least log.cleaner.min.compaction.lag.ms).", _STORAGE, 1, INT64_MAX),
    _k("log.cleaner.delete.retention.ms", "int", _LOG_DEFAULTS.delete_retention_ms,
       "Default delete.retention.ms: how long compaction keeps a tombstone (a record with a "
       "null value) so consumers see the delete.", _STORAGE, 0, INT64_MAX),
    _k("log.cleaner.enable", "bool", True,
       "Run the log cleaner, which compacts topics whose cleanup.policy includes compact "
       "(the internal topics are compacted).", _CLEANER),
    _k("log.cleaner.threads", "int", 1,
       "Logs compacted at the same time, each by its own cleaner process (Kafka's threads; "
       "processes here, so compaction never holds the broker's interpreter lock).",
       _CLEANER, 1, 64),
    _k("log.cleaner.dedupe.buffer.size", "int", 128 * 1024 * 1024,
       "Memory for the cleaners' offset maps (key -> latest offset), shared by the threads; "
       "a dirty section with more keys than fit is compacted in several passes.", _CLEANER,
       1024 * 1024, INT64_MAX),
    _k("log.cleaner.io.max.bytes.per.second", "float", None,
       "Cap on the cleaners' read plus write rate, all threads (default: no cap).",
       _CLEANER, 1, None),
    _k("log.cleaner.backoff.ms", "int", 15_000,
       "How long the cleaner sleeps when no log needs compacting.", _CLEANER, 1, INT32_MAX),
    _k("log.retention.check.interval.ms", "int", 300_000,
       "How often retention runs.", _MANAGER, 1, INT32_MAX),
    _k("log.flush.scheduler.interval.ms", "int", 200,
       "How often logs are checked for a due flush.", _MANAGER, 1, INT32_MAX),
    _k("log.flush.syncfs.min.logs", "int", 0,
       "A flush of at least this many logs of one log dir makes them durable with one sync "
       "of its filesystem (Linux syncfs, kernel 5.8 or later) instead of an fsync of each "
       "file: one journal commit, not several per log, so thousands of partitions are "
       "flushed within seconds, for a fraction of the CPU. It also writes back whatever else is "
       "dirty on that filesystem, which costs produce throughput where brokers share a "
       "disk (docs/durability.md). 0 (the default): always fsync file by file.",
       _MANAGER, 0, INT32_MAX),
    _k("log.flush.offset.checkpoint.interval.ms", "int", 60_000,
       "How often recovery points are checkpointed.", _MANAGER, 1, INT32_MAX),
    _k("producer.id.expiration.ms", "int", 86_400_000,
       "How long a partition remembers an idempotent producer after its last batch; a "
       "producer silent for longer may continue at any sequence.", _MANAGER, 1, INT32_MAX),
    _k("producer.id.expiration.check.interval.ms", "int", 600_000,
       "How often expired producer ids are removed.", _MANAGER, 1, INT32_MAX),
    # -- the broker ---------------------------------------------------------------------------
    _k("connections.max.idle.ms", "int", 600_000,
       "Close a connection idle this long, and give up on a request whose body stalls "
       "this long.", _BROKER, 100, INT32_MAX),
    _k("max.connections", "int", INT32_MAX,
       "Most connections the broker holds at once, over its listeners; one more is closed "
       "on arrival (the client retries). Leave room for the other brokers' follower "
       "fetchers.", _CONNECTIONS, 0, INT32_MAX),
    _k("max.connections.per.ip", "int", INT32_MAX,
       "Most connections the broker holds from one client address; one more is closed on "
       "arrival.", _CONNECTIONS, 0, INT32_MAX),
    _k("max.connections.per.ip.overrides", "str", "",
       "Other per-address limits, as 'address:count,address:count' (IP addresses as the "
       "broker sees them).", _CONNECTIONS),
    _k("socket.request.max.bytes", "int", 100 * 1024 * 1024,
       "Largest request body a broker reads.", _BROKER, 1024, INT32_MAX),
    _k("replica.lag.time.max.ms", "int", 30_000,
       "A follower not caught up for this long leaves the ISR.", _BROKER, 1, INT32_MAX),
    _k("replica.fetch.wait.max.ms", "int", 500,
       "How long a leader holds a follower's fetch when it has nothing new.", _BROKER, 0,
       30_000),
    _k("replica.fetch.max.bytes", "int", 1024 * 1024,
       "Bytes a follower asks for per partition per fetch.", _BROKER, 1, INT32_MAX),
    _k("replica.fetch.response.max.bytes", "int", 10 * 1024 * 1024,
       "Bytes a follower asks for per fetch.", _BROKER, 1, INT32_MAX),
    _k("num.replica.fetchers", "int", 1,
       "Follower fetch sessions per source broker (partitions spread by hash).", _BROKER, 1,
       64),
    _k("max.incremental.fetch.session.cache.slots", "int", 1000,
       "Consumers' fetch sessions (KIP-227) a broker keeps; when full, a new one replaces "
       "the smallest only if it is bigger, else that consumer fetches without one.",
       _BROKER, 0, 1_000_000),
    _k("replica.high.watermark.checkpoint.interval.ms", "int", 5000,
       "How often high watermarks are checkpointed.", _BROKER, 1, INT32_MAX),
    _k("quota.window.num", "int", 11,
       "Samples a client quota's rate is measured over (kraftlog quotas).", _BROKER, 2, 1000),
    _k("quota.window.size.seconds", "int", 1,
       "Length of one sample of a client quota's rate.", _BROKER, 1, 3600),
    # -- consumer groups ------------------------------------------------------------------------
    _k("offsets.topic.num.partitions", "int", 10, "Partitions of __consumer_offsets.",
       _GROUPS, 1, 1000),
    _k("offsets.topic.segment.bytes", "int", 100 * 1024 * 1024,
       "segment.bytes of __consumer_offsets (compacted; its active segment is never "
       "cleaned, so this bounds what a new coordinator reads beyond the live keys).",
       _GROUPS, 1024, INT32_MAX),
    _k("offsets.topic.replication.factor", "int", 3,
       "Replicas of __consumer_offsets (capped at the live brokers).", _GROUPS, 1, 1000),
    _k("transaction.state.log.num.partitions", "int", 10,
       "Partitions of __transaction_state.", _TXNS, 1, 1000),
    _k("transaction.state.log.segment.bytes", "int", 100 * 1024 * 1024,
       "segment.bytes of __transaction_state (compacted, as __consumer_offsets).", _TXNS,
       1024, INT32_MAX),
    _k("transaction.state.log.replication.factor", "int", 3,
       "Replicas of __transaction_state (capped at the live brokers).", _TXNS, 1, 1000),
    _k("transaction.max.timeout.ms", "int", 900_000,
       "Longest transaction_timeout_ms a producer may ask for (else "
       "INVALID_TRANSACTION_TIMEOUT).", _TXNS, 1, INT32_MAX),
    _k("transactional.id.expiration.ms", "int", 604_800_000,
       "How long a transactional id with no transaction is kept.", _TXNS, 1, INT32_MAX),
    _k("group.consumer.session.timeout.ms", "int", 45_000,
       "Session of a member whose heartbeat names none.", _GROUPS, 1, INT32_MAX),
    _k("group.consumer.heartbeat.interval.ms", "int", 5000,
       "Heartbeat interval the coordinator asks members for.", _GROUPS, 1, INT32_MAX),
    _k("group.min.session.timeout.ms", "int", 6000,
       "Shortest session a member may ask for (else INVALID_SESSION_TIMEOUT).", _GROUPS, 1,
       INT32_MAX),
    _k("group.max.session.timeout.ms", "int", 1_800_000,
       "Longest session a member may ask for (else INVALID_SESSION_TIMEOUT).", _GROUPS, 1,
       INT32_MAX),
)

BY_NAME: dict[str, Key] = {key.name: key for key in SCHEMA}
assert len(BY_NAME) == len(SCHEMA), "a key is declared twice"


class ConfigError(ValueError):
    """A value the schema refuses (the caller adds where it came from)."""


def suggest(name: str) -> str:
    """`` did you mean 'x'?`` for the nearest known key, or ''."""
    close = difflib.get_close_matches(name, list(BY_NAME), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def unknown_key_message(name: str, where: str) -> str:
    return (f"unknown config key {name!r} in {where}{suggest(name)} "
            "(docs/config.md lists every key)")


def typed(key: Key, value: Any) -> Any:
    """``value`` as ``key``'s type, checked against its range. No text
    value may hold a NUL character (none is meaningful, and a path with
    one cannot be opened)."""
    if value is None:
        return None
    if any("\x00" in text for text in ([value] if isinstance(value, str) else
                                        value if isinstance(value, list) else [])
           if isinstance(text, str)):
        raise ConfigError(f"{key.name} must not contain a NUL character")
    if key.type == "int":
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ConfigError(f"{key.name} must be an integer, got {value!r}")
        try:
            number = int(value)
        except ValueError:
            raise ConfigError(f"{key.name} must be an integer, got {value!r}") from None
        if (key.min is not None and number < key.min) or (
                key.max is not None and number > key.max):
            raise ConfigError(f"{key.name} = {number} is outside {key.describe_range()}")
        return number
    if key.type == "float":
        return _typed_float(key, value)
    if key.type == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise ConfigError(f"{key.name} must be true or false, got {value!r}")
    if key.type == "dirs":
        if isinstance(value, str):
            return value
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return list(value)
        raise ConfigError(f"{key.name} must be a directory or a list of them, got {value!r}")
    if not isinstance(value, str):
        raise ConfigError(f"{key.name} must be a string, got {value!r}")
    return value


def _typed_float(key: Key, value: Any) -> float:
    """A finite number (TOML's int or float, or a string of one) as a float,
    within the key's range."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(f"{key.name} must be a number, got {value!r}")
    try:
        number = float(value)
    except ValueError:
        raise ConfigError(f"{key.name} must be a number, got {value!r}") from None
    except OverflowError:  # an int too large for a float (and to print)
        raise ConfigError(f"{key.name} must be a finite number, got an integer too large "
                          "for a float") from None
    if not math.isfinite(number):
        raise ConfigError(f"{key.name} must be a finite number, got {value!r}")
    if (key.min is not None and number < key.min) or (
            key.max is not None and number > key.max):
        raise ConfigError(f"{key.name} = {number} is outside {key.describe_range()}")
    return number + 0.0  # never -0.0


def render_markdown() -> str:
    """docs/config.md: every key, as this table declares it."""
    lines = ["# Node configuration", "",
             "Generated from `kraft/config_schema.py` (`render_markdown`); a test keeps this "
             "file equal to it. Keys are spelled as Kafka spells the same setting. An unknown "
             "key stops the node at start-up with the nearest valid name; "
             "`kraftlog node --config FILE --print-config` shows the effective value of each "
             "and where it came from. No key is dynamic yet: a change takes a restart.", "",
             "| key | type | default | range | what it does |", "|---|---|---|---|---|"]
    for key in SCHEMA:
        default = "(not set)" if key.default is None else f"`{key.default}`"
        lines.append(f"| `{key.name}` | {key.type} | {default} | {key.describe_range()} | "
                     f"{key.doc} |")
    return "\n".join(lines) + "\n"
