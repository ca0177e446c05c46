"""Typed errors raised by the storage engine.

Each error carries the stable code name the API reports (Kafka's name where
the meaning is the same). Errors about batch bytes live in ``storage.batch``,
which the client imports too; they are re-exported here so storage users need
one import.
"""

from storage.batch import (  # noqa: F401  (re-exported)
    CorruptRecordError,
    InvalidRecordError,
    RecordFormatError,
    RecordTooLargeError,
    UnsupportedCompressionTypeError,
)


class StorageError(Exception):
    """Base class for errors the log raises in normal operation."""

    code = "KAFKA_STORAGE_ERROR"


class OffsetOutOfRangeError(StorageError):
    """A read from an offset below the log start offset or above the log end."""

    code = "OFFSET_OUT_OF_RANGE"

    def __init__(self, offset: int, log_start_offset: int, log_end_offset: int) -> None:
        super().__init__(
            f"offset {offset} is out of range: the log holds offsets "
            f"[{log_start_offset}, {log_end_offset})")
        self.offset = offset
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset


class InvalidConfigError(StorageError):
    """A log configuration key that is unknown or a value out of range."""

    code = "INVALID_CONFIG"


class InvalidOffsetError(StorageError):
    """An offset argument that makes no sense for the operation (for example,
    truncating above the log end, or a follower batch that is not contiguous)."""

    code = "INVALID_REQUEST"


class LogDirectoryError(StorageError):
    """A log directory that cannot be read or written (disk failure, permissions)."""

    code = "KAFKA_STORAGE_ERROR"


class InvalidTopicError(StorageError):
    """A topic name that cannot become a partition directory."""

    code = "INVALID_TOPIC_EXCEPTION"


class OutOfOrderSequenceError(StorageError):
    """An idempotent producer's batch that does not continue its sequence:
    a batch before it is missing (``storage.producer_state``)."""

    code = "OUT_OF_ORDER_SEQUENCE_NUMBER"


class InvalidProducerEpochError(StorageError):
    """A batch from an older epoch of a producer than this partition has
    seen: a newer instance of the producer fenced it."""

    code = "INVALID_PRODUCER_EPOCH"


class InvalidTxnStateError(StorageError):
    """A write that contradicts the producer's transaction: a plain batch
    from a producer whose transaction is open in this partition."""

    code = "INVALID_TXN_STATE"


class TransactionCoordinatorFencedError(StorageError):
    """A transaction marker from a coordinator older than one this
    partition has seen (a deposed coordinator)."""

    code = "TRANSACTION_COORDINATOR_FENCED"
