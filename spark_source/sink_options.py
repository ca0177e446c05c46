"""The sink's options and input schema: Spark's Kafka sink contract, checked once.

``df.write.format("kraftlog")`` and ``df.writeStream.format("kraftlog")``
take the rows and options of ``format("kafka")``:

- columns ``value`` (required, string or binary), ``key`` (string or
  binary), ``topic`` (string; or the ``topic`` option, which wins),
  ``partition`` (int) and ``headers`` (array<struct<key string, value
  binary>>); other columns are ignored;
- ``kafka.bootstrap.servers`` (or the source's ``kraftlog.bootstrap.servers``),
  ``topic``, and producer settings as ``kafka.<Kafka producer property>``.

kraftlog adds ``exactlyOnce`` (default true: every row written exactly once
as a read_committed consumer sees it, see ``spark_source.sink``) and
``transactionalIdPrefix`` (the transactional ids' prefix; by default made
from the streaming query's id, or a fresh one per batch job).

Pure: no I/O. ``parse_sink_options`` and ``check_sink_schema`` raise
``InvalidOptionError`` with what to do, so a query fails when it starts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from spark_source.options import (SECURITY_OPTIONS, InvalidOptionError, _bool, _bootstrap,
                                   security_options)

#: ``kafka.<property>`` -> (ProducerConfig argument, type). Kafka spells them
#: dotted; the kraftlog producer takes them snake_cased.
PRODUCER_PROPERTIES: dict[str, tuple[str, type]] = {
    "acks": ("acks", str),
    "linger.ms": ("linger_ms", int),
    "batch.size": ("batch_size", int),
    "compression.type": ("compression_type", str),
    "buffer.memory": ("buffer_memory", int),
    "max.block.ms": ("max_block_ms", int),
    "max.in.flight.requests.per.connection": ("max_in_flight", int),
    "max.request.size": ("max_request_bytes", int),
    "request.timeout.ms": ("request_timeout_ms", int),
    "delivery.timeout.ms": ("delivery_timeout_ms", int),
    "retries": ("retries", int),
    "retry.backoff.ms": ("retry_backoff_ms", int),
    "transaction.timeout.ms": ("transaction_timeout_ms", int),
}
#: Kafka properties the sink sets itself, with the reason.
_REFUSED = {
    "kafka.key.serializer": "keys are written as given (binary, or a string as UTF-8): cast "
                            "the key column instead of setting kafka.key.serializer",
    "kafka.value.serializer": "values are written as given (binary, or a string as UTF-8): "
                              "cast the value column instead of setting kafka.value.serializer",
    "kafka.transactional.id": "the sink gives each task its own transactional id: set "
                              "transactionalIdPrefix to choose their prefix",
    "kafka.enable.idempotence": "the sink's producers are idempotent whenever acks is all; "
                                "with exactlyOnce=true they are transactional",
}
_SINK_OPTIONS = ("kraftlog.bootstrap.servers", "kafka.bootstrap.servers", "topic",
                 "exactlyOnce", "transactionalIdPrefix")
_SPELLING = {name.lower(): name for name in _SINK_OPTIONS}
#: What Spark passes along with the user's options: its own, not the sink's.
_IGNORED = {"checkpointlocation", "path", "queryname"}
#: A transactional id is at most 255 characters; the prefix leaves room for
#: "-<task number>".
PREFIX_CHARS_MAX = 200
_PREFIX_RE = re.compile(r"[A-Za-z0-9._-]+")


@dataclass(frozen=True)
class SinkOptions:
    bootstrap: str
    #: Every row goes to this topic (the ``topic`` option), else to its
    #: ``topic`` column.
    topic: str | None
    exactly_once: bool
    #: None: made from the query id (streaming) or per job (batch).
    transactional_id_prefix: str | None
    #: Keyword arguments for the kraftlog ``Producer``.
    producer: dict[str, Any] = field(default_factory=dict)
    #: The client's TLS settings (the source's security options; a password
    #: among them: kept out of the repr).
    security: dict[str, Any] = field(default_factory=dict, repr=False)


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    """The same options for batch and streaming writes."""
    opts = {str(k).lower(): str(v) for k, v in options.items()}
    producer: dict[str, Any] = {}
    unknown = []
    for key, value in opts.items():
        if key in _REFUSED:
            raise InvalidOptionError(_REFUSED[key])
        if key in _SPELLING or key in _IGNORED or key in SECURITY_OPTIONS:
            continue
        prop = key[len("kafka."):] if key.startswith("kafka.") else None
        if prop in PRODUCER_PROPERTIES:
            name, kind = PRODUCER_PROPERTIES[prop]
            producer[name] = _typed(key, value, kind)
        else:
            unknown.append(key)
    if unknown:
        raise InvalidOptionError(
            f"unknown option(s) {', '.join(sorted(unknown))} for the kraftlog sink. Supported: "
            f"{', '.join(_SINK_OPTIONS)}, and producer "
            f"settings {', '.join('kafka.' + p for p in PRODUCER_PROPERTIES)} (docs/spark.md)")
    bootstrap = _bootstrap(opts)
    topic = opts.get("topic")
    if topic is not None:
        topic = topic.strip()
        if not topic:
            raise InvalidOptionError("the topic option must name a topic, not be empty")
    exactly_once = _bool(opts, "exactlyonce", True, name="exactlyOnce")
    acks = producer.get("acks")
    if acks is not None:
        if acks.strip().lower() not in ("all", "-1", "0", "1"):
            raise InvalidOptionError(f"kafka.acks must be all, -1, 0 or 1, not {acks!r}")
        producer["acks"] = "all" if acks.strip().lower() in ("all", "-1") else int(acks)
        if exactly_once and producer["acks"] != "all":
            raise InvalidOptionError(
                f"exactlyOnce=true writes in transactions, which need kafka.acks=all (not "
                f"{acks}): remove kafka.acks, or set exactlyOnce=false for at-least-once "
                "writes")
    compression = producer.get("compression_type")
    if compression is not None:
        producer["compression_type"] = compression.strip().lower()
    prefix = opts.get("transactionalidprefix")
    if prefix is not None:
        prefix = prefix.strip()
        if not _PREFIX_RE.fullmatch(prefix) or len(prefix) > PREFIX_CHARS_MAX:
            raise InvalidOptionError(
                f"transactionalIdPrefix must be 1 to {PREFIX_CHARS_MAX} letters, digits, '.', "
                f"'_' or '-', not {prefix!r}")
        if not exactly_once:
            raise InvalidOptionError("transactionalIdPrefix only applies with exactlyOnce=true")
    return SinkOptions(bootstrap=bootstrap, topic=topic, exactly_once=exactly_once,
                       transactional_id_prefix=prefix, producer=producer,
                       security=security_options(opts))


def _typed(key: str, value: str, kind: type) -> Any:
    if kind is int:
        try:
            number = int(value.strip())
        except ValueError:
            raise InvalidOptionError(f"{key} must be an integer, not {value!r}") from None
        if number < 0:
            raise InvalidOptionError(f"{key} must be >= 0, not {number}")
        return number
    return value


def check_sink_schema(schema: Any, options: SinkOptions) -> None:
    """The input rows' schema (a pyspark StructType) against the Kafka
    sink's contract; messages as Spark's Kafka sink gives them, with what to
    do."""
    from pyspark.sql.types import (ArrayType, BinaryType, IntegerType, StringType,
                                   StructType)

    fields = {f.name.lower(): f.dataType for f in schema.fields}
    if "value" not in fields:
        raise InvalidOptionError(
            "Required attribute 'value' not found: the rows to write need a value column "
            "(string or binary), e.g. df.selectExpr('CAST(payload AS STRING) AS value')")
    for name in ("value", "key"):
        if name in fields and not isinstance(fields[name], (StringType, BinaryType)):
            raise InvalidOptionError(
                f"{name} attribute type must be a string or binary, not "
                f"{fields[name].simpleString()}: cast it, e.g. CAST({name} AS STRING)")
    if options.topic is None:
        if "topic" not in fields:
            raise InvalidOptionError(
                "Topic option required when no 'topic' attribute is present. Use the topic "
                "option for setting a topic.")
        if not isinstance(fields["topic"], StringType):
            raise InvalidOptionError(
                f"topic type must be a string, not {fields['topic'].simpleString()}")
    if "partition" in fields and not isinstance(fields["partition"], IntegerType):
        raise InvalidOptionError(
            f"partition attribute type must be an int, not "
            f"{fields['partition'].simpleString()}: CAST(partition AS INT)")
    if "headers" in fields:
        kind = fields["headers"]
        element = kind.elementType if isinstance(kind, ArrayType) else None
        ok = (isinstance(element, StructType) and len(element.fields) == 2
              and isinstance(element.fields[0].dataType, StringType)
              and isinstance(element.fields[1].dataType, BinaryType))
        if not ok:
            raise InvalidOptionError(
                f"headers attribute type must be an array<struct<key:string,value:binary>>, "
                f"not {kind.simpleString()}")
