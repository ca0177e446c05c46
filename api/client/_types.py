"""The small value types users see: partitions, record metadata, records.

All are NamedTuples: cheap to build (the consumer builds one per record),
hashable, comparable and printable.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

from protocol import TopicPartition

__all__ = ["TopicPartition", "RecordMetadata", "ConsumerRecord"]


class ConsumerGroupMetadata(NamedTuple):
    """What ``send_offsets_to_transaction`` needs of a consumer's group."""

    group_id: str


class RecordMetadata(NamedTuple):
    """Where a produced record landed. ``offset`` is -1 with ``acks=0`` (the
    producer does not wait for the broker's answer). ``timestamp`` is the
    record's create time, or the broker's append time for topics with
    ``message.timestamp.type=LogAppendTime``."""

    topic: str
    partition: int
    offset: int
    timestamp: int


class ConsumerRecord(NamedTuple):
    """One record as consumed. ``key`` and ``value`` are bytes or None;
    ``headers`` a tuple of ``(str, bytes or None)`` pairs; ``timestamp_type``
    Kafka's id of what ``timestamp`` means: 0 the producer's create time, 1
    the broker's log-append time (from the batch's attributes)."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp_type: int = 0


class OffsetAndTimestamp(NamedTuple):
    """The answer of ``offsets_for_times`` for one partition."""

    offset: int
    timestamp: int


class NewTopic(NamedTuple):
    """A topic to create. -1 takes the cluster's ``num.partitions`` /
    ``default.replication.factor``. ``replica_assignments`` (partition ->
    broker ids) replaces both when given."""

    name: str
    num_partitions: int = -1
    replication_factor: int = -1
    configs: Mapping[str, Any] = MappingProxyType({})  # shared default: read-only
    replica_assignments: Mapping[int, list[int]] | None = None


class TopicMetadata(NamedTuple):
    """A topic as the cluster's metadata lists it (``Consumer.list_topics``).
    ``topic_id`` changes when a topic is deleted and created again."""

    name: str
    topic_id: str | None
    partitions: frozenset[int]


class PartitionInfo(NamedTuple):
    """A partition as the metadata describes it; ``leader`` -1 while none.
    ``elr``: its eligible leader replicas (KIP-966: out of the ISR but
    holding every committed record) and ``last_known_leader`` (while it has
    no leader, the last one; else -1) only from ``Admin.describe_topics``."""

    partition: int
    leader: int
    leader_epoch: int
    replicas: list[int]
    isr: list[int]
    elr: tuple[int, ...] = ()
    last_known_leader: int = -1


class PartitionReassignment(NamedTuple):
    """A reassignment under way (Kafka's ``PartitionReassignment``):
    ``replicas`` holds the target replicas (first) and the original ones
    still being removed; ``adding_replicas`` are the targets still copying
    the log, ``removing_replicas`` the originals that leave once they have."""

    replicas: list[int]
    adding_replicas: list[int]
    removing_replicas: list[int]


class ConfigEntry(NamedTuple):
    """One config of a resource; ``source`` says where the value comes from:
    ``TOPIC_CONFIG`` (the topic's override) or ``DEFAULT_CONFIG``."""

    name: str
    value: Any
    source: str | None


class TopicDescription(NamedTuple):
    name: str
    topic_id: str | None
    partitions: list[PartitionInfo]
    configs: dict[str, Any]


def as_topic_partition(tp: Any) -> TopicPartition:
    """Accept ``TopicPartition`` or a ``(topic, partition)`` pair."""
    if isinstance(tp, TopicPartition):
        return tp
    try:
        topic, partition = tp
    except (TypeError, ValueError):
        raise TypeError(f"expected TopicPartition or (topic, partition), not {tp!r}") from None
    if not isinstance(topic, str) or not isinstance(partition, int) or partition < 0:
        raise TypeError(f"expected (str topic, int partition >= 0), not {tp!r}")
    return TopicPartition(topic, partition)


class PreparedTransaction(NamedTuple):
    """A transaction written and left open for another process to commit or
    abort (KIP-939's ``PreparedTxnState``): what
    ``Producer.prepare_transaction`` returns and
    ``Admin.complete_transaction`` takes."""

    transactional_id: str
    producer_id: int
    producer_epoch: int


class OffsetAndMetadata(NamedTuple):
    """A committed offset and the string committed with it."""

    offset: int
    metadata: str = ""
