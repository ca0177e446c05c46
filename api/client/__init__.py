"""The kraftlog Python client: producers, consumers and an admin client,
each synchronous (``Producer``, ``Consumer``, ``Admin``) and asyncio
(``AsyncProducer``, ``AsyncConsumer``, ``AsyncAdmin``). They speak the
broker's HTTP protocol (docs/protocol.md) and depend on nothing of kraftlog
but the record batch format (``storage.batch``) and what every part speaks
(``protocol``: error codes, the partitioner, partition names).

Modules by concept: ``accumulator`` (records into batches per partition),
``sender`` (batches to leaders), ``producer`` (the producers), ``fetcher``
(fetches from leaders into a buffer, batch decoding), ``consumer`` (the
consumers), ``group`` (a consumer's group member), ``admin``, ``config``
(settings, checked once).

::

    from api.client import Admin, Consumer, NewTopic, Producer

    with Admin("http://127.0.0.1:9092") as admin:
        admin.create_topics([NewTopic("orders", num_partitions=3)])
    with Producer("http://127.0.0.1:9092") as producer:
        producer.send("orders", b"hello", key=b"customer-1")
    with Consumer("http://127.0.0.1:9092", auto_offset_reset="earliest",
                  consumer_timeout_ms=1000) as consumer:
        consumer.assign([("orders", p) for p in range(3)])
        for record in consumer:
            print(record)
"""

from api.client._types import (ConfigEntry, ConsumerRecord, NewTopic, OffsetAndMetadata,
                               OffsetAndTimestamp, PartitionInfo, PartitionReassignment,
                               PreparedTransaction, RecordMetadata, TopicDescription,
                               TopicMetadata, TopicPartition)
from api.client.admin import Admin, AsyncAdmin, CreatedTopic, DelegationToken
from api.client.consumer import AsyncConsumer, Consumer
from api.client.errors import (AuthorizationError, BrokerNotAvailableError, BufferExhaustedError,
                               ClientClosedError, ClusterAuthorizationFailedError,
                               CorruptRecordError, GroupAuthorizationFailedError,
                               TopicAuthorizationFailedError,
                               TransactionalIdAuthorizationFailedError, InvalidTopicError,
                               KraftlogError,
                               LeaderNotAvailableError, MessageTooLargeError,
                               NoOffsetForPartitionError, NotEnoughReplicasAfterAppendError,
                               NotEnoughReplicasError, NotLeaderError, OffsetOutOfRangeError,
                               RequestTimedOutError, SaslAuthenticationError,
                               SslAuthenticationError,
                               TopicAlreadyExistsError,
                               UnknownTopicOrPartitionError, error_from)
from api.client.group import CommitFailedError
from api.client.producer import AsyncProducer, Producer, RecordHandle
from protocol.acl import AclBinding, AclBindingFilter
from storage.batch import build_batch as _build_batch


def encode_batch(records) -> bytes:
    """One record batch holding ``records`` (``(key, value)`` pairs of bytes
    or None), as ``POST /v1/produce`` takes it in ``records``: for talking
    to a broker over HTTP without the producer."""
    return _build_batch(list(records))


__all__ = [
    "AclBinding", "AclBindingFilter", "Admin", "AsyncAdmin", "AsyncConsumer", "AsyncProducer",
    "AuthorizationError", "DelegationToken",
    "BrokerNotAvailableError", "ClusterAuthorizationFailedError",
    "GroupAuthorizationFailedError", "TopicAuthorizationFailedError",
    "TransactionalIdAuthorizationFailedError",
    "BufferExhaustedError", "ClientClosedError", "CommitFailedError", "ConfigEntry",
    "Consumer", "ConsumerRecord",
    "CorruptRecordError", "CreatedTopic", "InvalidTopicError", "KraftlogError",
    "encode_batch",
    "LeaderNotAvailableError", "MessageTooLargeError", "NewTopic", "NoOffsetForPartitionError",
    "NotEnoughReplicasAfterAppendError", "NotEnoughReplicasError", "NotLeaderError",
    "OffsetAndMetadata", "OffsetAndTimestamp", "OffsetOutOfRangeError",
    "PartitionInfo", "PartitionReassignment", "PreparedTransaction", "Producer", "RecordHandle",
    "RecordMetadata", "RequestTimedOutError", "SaslAuthenticationError",
    "SslAuthenticationError",
    "TopicAlreadyExistsError", "TopicDescription", "TopicMetadata", "TopicPartition",
    "UnknownTopicOrPartitionError", "error_from",
]
