"""The source's options: Spark's Kafka source names and meanings, checked once.

A user switching ``format("kafka")`` to ``format("kraftlog")`` keeps every
option. ``parse_options`` turns Spark's (lower-cased, string) options into a
``SourceOptions`` and refuses, with a message that says what to do, anything
unknown, malformed or conflicting, so a query fails when it starts rather
than after hours. It is pure: no I/O, no Spark.

Offsets as JSON, exactly as Spark's Kafka source writes them::

    {"orders": {"0": 23, "1": -2}, "clicks": {"0": -1}}

with -2 meaning earliest and -1 latest. Timestamps are epoch milliseconds;
durations (``maxTriggerDelay``) are Spark's time strings ("15m", "30s",
"500ms"; a bare number is milliseconds).

A streaming query's offset in Spark's checkpoint has the same per-partition
layout plus one reserved key, ``TOPIC_IDS_KEY``, holding each topic's id
(``offsets_to_dict``); ``$`` is never part of a topic name, so the key
cannot clash with one, and an offset without it (older checkpoints) reads as
before.

Where Spark's Kafka source gives a precedence rather than refusing, so does
this one: ``startingTimestamp`` over ``startingOffsetsByTimestamp`` over
``startingOffsets`` (the same for ``ending*``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: The name to use in ``format(...)``.
FORMAT = "kraftlog"
EARLIEST = -2
LATEST = -1

#: Spark's default for ``kafkaConsumer.pollTimeoutMs`` (spark.network.timeout).
POLL_TIMEOUT_MS_DEFAULT = 120_000
#: Spark's default for ``maxTriggerDelay`` (15m).
MAX_TRIGGER_DELAY_MS_DEFAULT = 15 * 60 * 1000
#: The key of a streaming offset holding ``{topic: topic id}``.
TOPIC_IDS_KEY = "$topicIds"

TopicPartitionKey = tuple[str, int]


class InvalidOptionError(ValueError):
    """An option the source cannot accept; the message says which and why."""


@dataclass(frozen=True)
class Subscription:
    """What to read: exactly one of ``topics`` (subscribe), ``pattern``
    (subscribePattern, matched against whole topic names, internal ``__``
    topics excluded) or ``partitions`` (assign)."""

    topics: tuple[str, ...] | None = None
    pattern: str | None = None
    partitions: tuple[TopicPartitionKey, ...] | None = None

    def matches(self, topic: str) -> bool:
        if self.topics is not None:
            return topic in self.topics
        if self.pattern is not None:
            return not topic.startswith("__") and re.fullmatch(self.pattern, topic) is not None
        return any(t == topic for t, _p in self.partitions or ())

    def describe(self) -> str:
        if self.topics is not None:
            return f"subscribe={','.join(self.topics)}"
        if self.pattern is not None:
            return f"subscribePattern={self.pattern}"
        assigned: dict[str, list[int]] = {}
        for topic, partition in self.partitions or ():
            assigned.setdefault(topic, []).append(partition)
        return f"assign={json.dumps(assigned, sort_keys=True)}"


@dataclass(frozen=True)
class OffsetSpec:
    """Where a read starts or ends.

    ``kind`` is one of ``earliest``, ``latest``, ``offsets`` (``offsets``
    maps each partition to an offset, or EARLIEST/LATEST), ``timestamp``
    (every partition at ``timestamp`` ms) or ``timestamps`` (``offsets``
    maps each partition to a timestamp in ms).
    """

    kind: str
    offsets: Mapping[TopicPartitionKey, int] | None = None
    timestamp: int | None = None

    def option_name(self, which: str) -> str:
        """The option the user gave for this spec; ``which`` is "starting"
        or "ending"."""
        suffix = {"timestamp": "Timestamp", "timestamps": "OffsetsByTimestamp"}.get(
            self.kind, "Offsets")
        return which + suffix


@dataclass(frozen=True)
class SourceOptions:
    bootstrap: str
    subscription: Subscription
    starting: OffsetSpec
    #: None in streaming queries (they have no end).
    ending: OffsetSpec | None
    #: What a timestamp with no record at or after it means: "error" or
    #: "latest" (Spark's startingOffsetsByTimestampStrategy).
    timestamp_strategy: str
    #: Records per micro-batch at most, across all partitions (None: all).
    max_offsets_per_trigger: int | None
    fail_on_data_loss: bool
    include_headers: bool
    #: Split offset ranges so a query has at least this many Spark tasks.
    min_partitions: int | None
    #: Split offset ranges so no Spark task reads more records than this.
    max_records_per_partition: int | None
    #: How long an executor waits for records it was told exist before it
    #: checks for data loss (kafkaConsumer.pollTimeoutMs).
    poll_timeout_ms: int
    #: Driver-side offset lookups: attempts after the first, and the pause.
    fetch_offset_retries: int
    fetch_offset_retry_interval_ms: int
    #: kafka.isolation.level: read_uncommitted or read_committed.
    isolation_level: str = "read_uncommitted"
    #: A micro-batch waits until at least this many offsets are waiting
    #: across partitions (None: it never waits) ...
    min_offsets_per_trigger: int | None = None
    #: ... or until this long after the last trigger that was not held back.
    #: Only meaningful with ``min_offsets_per_trigger``.
    max_trigger_delay_ms: int = MAX_TRIGGER_DELAY_MS_DEFAULT
    #: The client's TLS settings (security_options), as keyword arguments
    #: (a password among them: kept out of the repr).
    security: dict = field(default_factory=dict, repr=False)


# Lower-case, as Spark hands them over; the spelling users write is kept for
# messages.
_SPELLING = {name.lower(): name for name in (
    "kraftlog.bootstrap.servers", "kafka.bootstrap.servers", "subscribe", "subscribePattern",
    "assign", "startingOffsets", "endingOffsets", "startingTimestamp", "endingTimestamp",
    "startingOffsetsByTimestamp", "endingOffsetsByTimestamp",
    "startingOffsetsByTimestampStrategy", "maxOffsetsPerTrigger", "minOffsetsPerTrigger",
    "maxTriggerDelay", "failOnDataLoss",
    "includeHeaders", "minPartitions", "maxRecordsPerPartition", "kafkaConsumer.pollTimeoutMs",
    "fetchOffset.numRetries", "fetchOffset.retryIntervalMs", "kafka.isolation.level",
    "kafka.security.protocol", "kafka.ssl.truststore.location", "kafka.ssl.truststore.type",
    "kafka.ssl.keystore.location", "kafka.ssl.keystore.type",
    "kafka.ssl.endpoint.identification.algorithm", "kafka.sasl.mechanism",
    "kafka.sasl.jaas.config")}
_BATCH_ONLY = ("endingoffsets", "endingtimestamp", "endingoffsetsbytimestamp")
# Spark Kafka options this source refuses, with the reason.
_NOT_SUPPORTED = {
    "groupidprefix": "kraftlog reads without consumer groups (offsets live in Spark's "
                     "checkpoint): remove groupIdPrefix",
    "kafka.group.id": "kraftlog reads without consumer groups (offsets live in Spark's "
                      "checkpoint): remove kafka.group.id",
    "path": "kraftlog reads topics, not paths: use load() without a path and name the "
            "topics with subscribe, subscribePattern or assign",
}


def _name(key: str) -> str:
    return _SPELLING.get(key, key)


def parse_options(options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    """Check every option and return them parsed; raises
    ``InvalidOptionError`` naming the option and what to do."""
    opts = {str(k).lower(): str(v) for k, v in options.items()}
    _refuse_unknown(opts, streaming)
    bootstrap = _bootstrap(opts)
    subscription = _subscription(opts)
    starting = _starting(opts, streaming)
    ending = None if streaming else _ending(opts)
    strategy = opts.get("startingoffsetsbytimestampstrategy", "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise InvalidOptionError(
            f"startingOffsetsByTimestampStrategy must be 'error' or 'latest', not {strategy!r}")
    if subscription.partitions is not None:
        for spec, which in ((starting, "starting"), (ending, "ending")):
            if spec is not None and spec.offsets is not None:
                _check_assigned(spec, subscription, spec.option_name(which))
    max_offsets = _positive_int(opts, "maxoffsetspertrigger")
    min_offsets = _positive_int(opts, "minoffsetspertrigger")
    if min_offsets is not None and max_offsets is not None and min_offsets > max_offsets:
        raise InvalidOptionError(
            f"minOffsetsPerTrigger ({min_offsets}) is higher than maxOffsetsPerTrigger "
            f"({max_offsets}): no micro-batch could satisfy both; lower the first or raise "
            "the second")
    return SourceOptions(
        bootstrap=bootstrap, subscription=subscription, starting=starting, ending=ending,
        timestamp_strategy=strategy,
        max_offsets_per_trigger=max_offsets,
        min_offsets_per_trigger=min_offsets,
        max_trigger_delay_ms=_duration_ms(opts, "maxtriggerdelay", MAX_TRIGGER_DELAY_MS_DEFAULT),
        fail_on_data_loss=_bool(opts, "failondataloss", True),
        include_headers=_bool(opts, "includeheaders", False),
        min_partitions=_positive_int(opts, "minpartitions"),
        max_records_per_partition=_positive_int(opts, "maxrecordsperpartition"),
        poll_timeout_ms=_positive_int(opts, "kafkaconsumer.polltimeoutms")
        or POLL_TIMEOUT_MS_DEFAULT,
        fetch_offset_retries=_int(opts, "fetchoffset.numretries", 3, low=0),
        fetch_offset_retry_interval_ms=_int(opts, "fetchoffset.retryintervalms", 1000, low=0),
        isolation_level=_isolation_level(opts), security=security_options(opts))


def _jaas_credentials(jaas: str) -> dict:
    """The user name and password of a ``kafka.sasl.jaas.config`` as Kafka
    clients write it (``...ScramLoginModule required username="u"
    password="p";``)."""
    import re
    found = {key: re.search(rf'{key}\s*=\s*"((?:[^"\\]|\\.)*)"', jaas)
             for key in ("username", "password")}
    if not all(found.values()):
        raise InvalidOptionError(
            "kafka.security.protocol=SASL_SSL needs kafka.sasl.jaas.config with the user: "
            'org.apache.kafka.common.security.scram.ScramLoginModule required username="..." '
            'password="...";')
    def unescaped(value: str) -> str:  # as Kafka's JAAS parser reads \" and \\
        return re.sub(r"\\(.)", r"\1", value)
    return {"sasl_plain_username": unescaped(found["username"].group(1)),
            "sasl_plain_password": unescaped(found["password"].group(1))}


#: The TLS options, which the sink takes too (lower-case).
SECURITY_OPTIONS = frozenset(k for k in _SPELLING if k.startswith("kafka.s"))


def security_options(opts: Mapping[str, str]) -> dict:
    """Kafka's client TLS properties, as Spark's Kafka source takes them,
    with PEM files (``ssl.truststore.type`` / ``ssl.keystore.type`` PEM,
    Kafka's own way to give PEM): ``kafka.security.protocol`` PLAINTEXT or
    SSL, ``kafka.ssl.truststore.location`` (CA certificates),
    ``kafka.ssl.keystore.location`` (the client's certificate and key in one
    PEM file), ``kafka.ssl.endpoint.identification.algorithm`` ("" skips
    the host name check). The client's keyword arguments."""
    protocol = opts.get("kafka.security.protocol", "PLAINTEXT").strip().upper()
    if protocol not in ("PLAINTEXT", "SSL", "SASL_SSL"):
        raise InvalidOptionError(
            f"kafka.security.protocol must be PLAINTEXT, SSL or SASL_SSL, not {protocol!r}"
            + (" (SASL_PLAINTEXT would send the password in clear)"
               if protocol == "SASL_PLAINTEXT" else ""))
    for store in ("truststore", "keystore"):
        kind = opts.get(f"kafka.ssl.{store}.type", "PEM").strip().upper()
        if kind != "PEM":
            raise InvalidOptionError(
                f"kafka.ssl.{store}.type must be PEM, not {kind}: kraftlog reads PEM files "
                f"(convert a JKS or PKCS12 store with keytool and openssl)")
    settings: dict = {}
    if protocol != "PLAINTEXT":
        settings["security_protocol"] = protocol
    if protocol == "SASL_SSL":
        settings.update(_jaas_credentials(opts.get("kafka.sasl.jaas.config", "")))
        if "kafka.sasl.mechanism" in opts:
            settings["sasl_mechanism"] = opts["kafka.sasl.mechanism"].strip().upper()
    elif "kafka.sasl.jaas.config" in opts:
        raise InvalidOptionError("kafka.sasl.jaas.config needs kafka.security.protocol=SASL_SSL")
    if "kafka.ssl.truststore.location" in opts:
        settings["ssl_cafile"] = opts["kafka.ssl.truststore.location"]
    if "kafka.ssl.keystore.location" in opts:
        settings["ssl_certfile"] = opts["kafka.ssl.keystore.location"]
    algorithm = opts.get("kafka.ssl.endpoint.identification.algorithm")
    if algorithm is not None:
        if algorithm.strip().lower() not in ("", "https"):
            raise InvalidOptionError(
                "kafka.ssl.endpoint.identification.algorithm must be https or empty")
        settings["ssl_check_hostname"] = algorithm.strip().lower() == "https"
    return settings


def _isolation_level(opts: Mapping[str, str]) -> str:
    """``kafka.isolation.level``: read_uncommitted (Kafka's default) or
    read_committed (only committed transactions, up to the last stable offset)."""
    value = opts.get("kafka.isolation.level", "read_uncommitted").strip().lower()
    if value not in ("read_uncommitted", "read_committed"):
        raise InvalidOptionError(f"kafka.isolation.level must be read_uncommitted or "
                                 f"read_committed, not {value!r}")
    return value


def include_headers(options: Mapping[str, str]) -> bool:
    """Just ``includeHeaders`` (the schema depends on it, and is asked for
    before the query says whether it is batch or streaming)."""
    return _bool({str(k).lower(): str(v) for k, v in options.items()}, "includeheaders", False)


def _refuse_unknown(opts: Mapping[str, str], streaming: bool) -> None:
    for key in opts:
        if key in _NOT_SUPPORTED:
            raise InvalidOptionError(_NOT_SUPPORTED[key])
    unknown = sorted(k for k in opts if k not in _SPELLING)
    if unknown:
        kafka_props = [k for k in unknown if k.startswith("kafka.")]
        hint = (f" kraftlog is not a Kafka client, so Kafka client properties "
                f"({', '.join(kafka_props)}) do not apply." if kafka_props else "")
        raise InvalidOptionError(
            f"unknown option(s) {', '.join(unknown)} for format('kraftlog').{hint} "
            f"Supported: {', '.join(sorted(_SPELLING.values()))} (see docs/spark.md)")
    if streaming:
        given = [_name(k) for k in _BATCH_ONLY if k in opts]
        if given:
            raise InvalidOptionError(
                f"{', '.join(given)} only apply to batch queries (spark.read); a streaming "
                "query has no end: remove it, or use Trigger.AvailableNow to stop at the "
                "data present when the query starts")


def _bootstrap(opts: Mapping[str, str]) -> str:
    ssl = opts.get("kafka.security.protocol", "").strip().upper() in ("SSL", "SASL_SSL")
    values = {_normal_urls(opts[k], "https" if ssl else "http")
              for k in ("kraftlog.bootstrap.servers", "kafka.bootstrap.servers") if k in opts}
    values.discard("")
    if not values:
        raise InvalidOptionError(
            "option kraftlog.bootstrap.servers is required: the broker URLs, comma-separated "
            "(e.g. http://127.0.0.1:9092); kafka.bootstrap.servers is accepted too")
    if len(values) > 1:
        raise InvalidOptionError(
            "kraftlog.bootstrap.servers and kafka.bootstrap.servers disagree "
            f"({' vs '.join(sorted(values))}): give one of them")
    return values.pop()


def _normal_urls(value: str, scheme: str = "http") -> str:
    """"h:9092, http://g:9092/" -> "http://h:9092,http://g:9092" (what the
    client makes of it; https with kafka.security.protocol SSL), so two
    spellings of one list agree."""
    urls = []
    for item in value.split(","):
        url = item.strip().rstrip("/")
        if url:
            if scheme == "https" and url.startswith("http://"):
                url = "https://" + url[len("http://"):]
            urls.append(url if "://" in url else f"{scheme}://{url}")
    return ",".join(urls)


def _subscription(opts: Mapping[str, str]) -> Subscription:
    given = [k for k in ("subscribe", "subscribepattern", "assign") if k in opts]
    if len(given) != 1:
        what = "none was given" if not given else f"got {', '.join(_name(k) for k in given)}"
        raise InvalidOptionError(
            f"exactly one of subscribe, subscribePattern or assign is required; {what}")
    key = given[0]
    value = opts[key].strip()
    if key == "subscribe":
        topics = tuple(dict.fromkeys(t.strip() for t in value.split(",") if t.strip()))
        if not topics:
            raise InvalidOptionError(
                f"subscribe must list one or more topics, comma-separated, not {value!r}")
        return Subscription(topics=topics)
    if key == "subscribepattern":
        if not value:
            raise InvalidOptionError("subscribePattern must be a non-empty regular expression")
        try:
            re.compile(value)
        except re.error as exc:
            raise InvalidOptionError(
                f"subscribePattern {value!r} is not a valid regular expression: {exc}") from None
        return Subscription(pattern=value)
    parsed = _json_object("assign", value)
    partitions = []
    for topic, numbers in parsed.items():
        if not isinstance(numbers, list) or not numbers or not all(
                isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in numbers):
            raise InvalidOptionError(
                f'assign: {topic!r} must map to a list of partition numbers, e.g. '
                f'{{"{topic}": [0, 1]}}, not {numbers!r}')
        partitions.extend((topic, n) for n in numbers)
    if not partitions:
        raise InvalidOptionError('assign must name at least one partition, e.g. {"orders": [0]}')
    return Subscription(partitions=tuple(sorted(set(partitions))))


def _starting(opts: Mapping[str, str], streaming: bool) -> OffsetSpec:
    spec = _offset_spec(opts, "starting", "earliest" if not streaming else "latest")
    if not streaming and _means(spec, LATEST):
        raise InvalidOptionError(
            "startingOffsets cannot be latest (or -1) in a batch query: it would read nothing; "
            "use earliest, specific offsets, or a streaming query")
    return spec


def _ending(opts: Mapping[str, str]) -> OffsetSpec:
    spec = _offset_spec(opts, "ending", "latest")
    if _means(spec, EARLIEST):
        raise InvalidOptionError(
            "endingOffsets cannot be earliest (or -2) in a batch query: it would read nothing; "
            "use latest or specific offsets")
    return spec


def _means(spec: OffsetSpec, special: int) -> bool:
    name = "earliest" if special == EARLIEST else "latest"
    if spec.kind == name:
        return True
    return spec.kind == "offsets" and any(o == special for o in (spec.offsets or {}).values())


def _offset_spec(opts: Mapping[str, str], which: str, default: str) -> OffsetSpec:
    """``which`` is "starting" or "ending"; Spark's precedence: one
    timestamp, then timestamps per partition, then offsets."""
    key = f"{which}timestamp"
    if key in opts:
        return OffsetSpec("timestamp", timestamp=_timestamp(_name(key), opts[key]))
    key = f"{which}offsetsbytimestamp"
    if key in opts:
        table = _partition_table(_name(key), opts[key])
        for (topic, partition), ts in table.items():
            if ts < 0:
                raise InvalidOptionError(
                    f"{_name(key)}: the timestamp of {topic}-{partition} must be epoch ms >= 0, "
                    f"not {ts}")
        return OffsetSpec("timestamps", offsets=table)
    key = f"{which}offsets"
    value = opts.get(key, default).strip()
    if value.lower() in ("earliest", "latest"):
        return OffsetSpec(value.lower())
    if not value.startswith("{"):
        raise InvalidOptionError(
            f"{_name(key)} must be earliest, latest, or JSON such as "
            f'{{"orders": {{"0": 23, "1": -2}}}} (-2 earliest, -1 latest), not {value!r}')
    table = _partition_table(_name(key), value)
    for (topic, partition), offset in table.items():
        if offset < EARLIEST:
            raise InvalidOptionError(
                f"{_name(key)}: offset {offset} of {topic}-{partition} is invalid: use an "
                "offset >= 0, -2 for earliest or -1 for latest")
    return OffsetSpec("offsets", offsets=table)


def _check_assigned(spec: OffsetSpec, subscription: Subscription, which: str) -> None:
    named = set(spec.offsets or {})
    assigned = set(subscription.partitions or ())
    if named != assigned:
        missing = sorted(assigned - named)
        extra = sorted(named - assigned)
        raise InvalidOptionError(
            f"{which} must give every assigned partition and no other: "
            + "; ".join(part for part in (
                f"missing {', '.join(f'{t}-{p}' for t, p in missing)}" if missing else "",
                f"not assigned {', '.join(f'{t}-{p}' for t, p in extra)}" if extra else "")
                if part) + ("" if spec.kind == "timestamps" else
                            " (use -2 for earliest, -1 for latest)"))


def _json_object(name: str, value: str) -> dict:
    try:
        parsed = json.loads(value)
    except ValueError as exc:
        raise InvalidOptionError(f"{name} is not valid JSON ({exc}): {value!r}") from None
    if not isinstance(parsed, dict):
        raise InvalidOptionError(f"{name} must be a JSON object, not {value!r}")
    return parsed


def _partition_table(name: str, value: str) -> dict[TopicPartitionKey, int]:
    """``{"topic": {"0": n, ...}, ...}`` -> {(topic, 0): n}."""
    parsed = _json_object(name, value)
    table: dict[TopicPartitionKey, int] = {}
    for topic, per_partition in parsed.items():
        if not isinstance(per_partition, dict) or not per_partition:
            raise InvalidOptionError(
                f'{name}: {topic!r} must map partition numbers to values, e.g. '
                f'{{"{topic}": {{"0": 23}}}}, not {per_partition!r}')
        for partition, number in per_partition.items():
            if not _is_partition_number(partition):
                raise InvalidOptionError(
                    f"{name}: partition {partition!r} of {topic!r} is not a partition number")
            if not isinstance(number, int) or isinstance(number, bool):
                raise InvalidOptionError(
                    f"{name}: the value for {topic}-{partition} must be an integer, "
                    f"not {number!r}")
            table[(topic, int(partition))] = number
    return table


def offsets_to_dict(offsets: Mapping[TopicPartitionKey, int],
                    topic_ids: Mapping[str, str] | None = None) -> dict[str, Any]:
    """{(topic, 0): 23} -> {"topic": {"0": 23}}: the streaming offset Spark
    keeps in its checkpoint (the Kafka source's layout), topics and
    partitions in order. With ``topic_ids``, the ids of the topics that have
    partitions in ``offsets`` go last, under ``TOPIC_IDS_KEY``::

        {"orders": {"0": 23}, "$topicIds": {"orders": "6f1c..."}}

    Spark compares offsets as JSON text, so equal arguments must give equal
    text: hence the fixed order."""
    nested: dict[str, Any] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        nested.setdefault(topic, {})[str(partition)] = int(offset)
    ids = {topic: str(topic_ids[topic]) for topic in nested
           if topic_ids is not None and topic_ids.get(topic) is not None}
    if ids:
        nested[TOPIC_IDS_KEY] = ids
    return nested


def offsets_from_dict(nested: Mapping[str, Any]) -> dict[TopicPartitionKey, int]:
    """The offsets of ``offsets_to_dict``'s answer, checking the shape (a
    checkpoint written by something else fails here, clearly); the topic ids
    are ``topic_ids_from_dict``'s."""
    if not isinstance(nested, Mapping):
        raise ValueError(f"a kraftlog offset must be a JSON object, not {nested!r}")
    topic_ids_from_dict(nested)
    offsets = {}
    for topic, per_partition in nested.items():
        if topic == TOPIC_IDS_KEY:
            continue
        if not isinstance(per_partition, Mapping):
            raise ValueError(f"offset of topic {topic!r} must be an object, not {per_partition!r}")
        for partition, offset in per_partition.items():
            if (not _is_partition_number(partition) or not isinstance(offset, int)
                    or isinstance(offset, bool)):
                raise ValueError(f"bad offset entry {topic}/{partition}: {offset!r}")
            offsets[(str(topic), int(partition))] = offset
    return offsets


def topic_ids_from_dict(nested: Mapping[str, Any]) -> dict[str, str]:
    """The topic ids kept in a streaming offset: {} when it has none (an
    offset of an older checkpoint, or topics whose id was unknown)."""
    ids = nested.get(TOPIC_IDS_KEY, {}) if isinstance(nested, Mapping) else {}
    if not isinstance(ids, Mapping) or not all(
            isinstance(topic, str) and isinstance(topic_id, str) and topic_id
            for topic, topic_id in ids.items()):
        raise ValueError(f"{TOPIC_IDS_KEY} of a kraftlog offset must map topic names to ids, "
                         f"not {ids!r}")
    return dict(ids)


def _is_partition_number(text: Any) -> bool:
    # ASCII digits only: str.isdigit() also takes "²", which int() refuses.
    return isinstance(text, str) and text.isascii() and text.isdigit()


def _timestamp(name: str, value: str) -> int:
    try:
        ts = int(value.strip())
    except ValueError:
        raise InvalidOptionError(
            f"{name} must be epoch milliseconds (an integer), not {value!r}") from None
    if ts < 0:
        raise InvalidOptionError(f"{name} must be epoch milliseconds >= 0, not {ts}")
    return ts


def _bool(opts: Mapping[str, str], key: str, default: bool, name: str | None = None) -> bool:
    """``opts[key]`` as true/false; ``name``: the option's spelling for
    messages (default: the source's)."""
    if key not in opts:
        return default
    value = opts[key].strip().lower()
    if value not in ("true", "false"):
        raise InvalidOptionError(f"{name or _name(key)} must be true or false, "
                                 f"not {opts[key]!r}")
    return value == "true"


def _int(opts: Mapping[str, str], key: str, default: int, *, low: int) -> int:
    if key not in opts:
        return default
    try:
        value = int(opts[key].strip())
    except ValueError:
        raise InvalidOptionError(f"{_name(key)} must be an integer, not {opts[key]!r}") from None
    if value < low:
        raise InvalidOptionError(f"{_name(key)} must be >= {low}, not {value}")
    return value


def _positive_int(opts: Mapping[str, str], key: str) -> int | None:
    return _int(opts, key, 0, low=1) if key in opts else None


# Spark's time-string units (JavaUtils.timeStringAs), in microseconds.
_DURATION_UNITS_US = {"us": 1, "ms": 1000, "s": 1_000_000, "m": 60_000_000,
                      "min": 60_000_000, "h": 3_600_000_000, "d": 86_400_000_000}
_DURATION = re.compile(r"([0-9]+)([a-z]+)?")


def parse_duration_ms(name: str, value: str) -> int:
    """A Spark time string ("15m", "30s", "500ms", "2h", "1d"; a bare number
    is milliseconds) in whole milliseconds, > 0; ``name`` is the option's,
    for the message."""
    text = value.strip().lower()
    match = _DURATION.fullmatch(text)
    unit = (match.group(2) or "ms") if match else None
    if match is None or unit not in _DURATION_UNITS_US:
        raise InvalidOptionError(
            f"{name} must be a duration: a whole number with a unit among "
            f"{', '.join(_DURATION_UNITS_US)} (e.g. 15m, 30s, 500ms), or a number of "
            f"milliseconds; not {value!r}")
    duration_ms = int(match.group(1)) * _DURATION_UNITS_US[unit] // 1000
    if duration_ms <= 0:
        raise InvalidOptionError(
            f"{name} must be at least 1ms, not {value!r} (a batch would never wait; "
            "to never hold batches back, remove minOffsetsPerTrigger)")
    return duration_ms


def _duration_ms(opts: Mapping[str, str], key: str, default: int) -> int:
    return parse_duration_ms(_name(key), opts[key]) if key in opts else default
