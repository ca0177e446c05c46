"""The clients' settings, each checked once: names as Kafka's, snake_case."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from api.client._transport import DEFAULT_BOOTSTRAP, Security, default_client_id
from api.client.accumulator import MAX_REQUEST_BYTES_DEFAULT, Partitioner
from api.client.idempotence import MAX_IN_FLIGHT_IDEMPOTENT
from storage.batch import Compression


class ProducerConfig:
    """The producer's settings, checked once. Names as Kafka's, snake_case."""

    def __init__(self, *, bootstrap: str | Iterable[str] = DEFAULT_BOOTSTRAP,
                 acks: int | str = "all", linger_ms: int = 5,
                 batch_size: int = 16384 * 64, buffer_memory: int = 32 * 1024 * 1024,
                 max_block_ms: int = 60_000, compression_type: str | None = "none",
                 retries: int = 2**31 - 1, retry_backoff_ms: int = 100,
                 delivery_timeout_ms: int = 120_000, request_timeout_ms: int = 30_000,
                 max_in_flight: int = 5, max_request_bytes: int = MAX_REQUEST_BYTES_DEFAULT,
                 metadata_max_age_ms: int = 300_000,
                 partitioner: Partitioner | None = None,
                 enable_idempotence: bool | None = None,
                 transactional_id: str | None = None,
                 transaction_timeout_ms: int = 60_000,
                 transaction_two_phase_commit: bool = False,
                 security_protocol: str = "PLAINTEXT", ssl_cafile: str | None = None,
                 ssl_certfile: str | None = None, ssl_keyfile: str | None = None,
                 ssl_check_hostname: bool = True, client_id: str | None = None,
                 sasl_mechanism: str | None = None, sasl_plain_username: str | None = None,
                 sasl_plain_password: str | None = None,
                 sasl_oauth_token_provider: Any = None) -> None:
        self.security = Security(security_protocol, ssl_cafile, ssl_certfile, ssl_keyfile,
                                 ssl_check_hostname, sasl_mechanism, sasl_plain_username,
                                 sasl_plain_password, sasl_oauth_token_provider)
        self.client_id = default_client_id("producer") if client_id is None else client_id
        if acks == "all":
            acks = -1
        if acks not in (0, 1, -1):
            raise ValueError(f"acks must be 0, 1, -1 or 'all', not {acks!r}")
        if transactional_id is not None:
            if not isinstance(transactional_id, str) or not 0 < len(transactional_id) <= 255:
                raise ValueError("transactional_id must be a non-empty str of at most 255 "
                                 f"characters, not {transactional_id!r}")
            if enable_idempotence is False:
                raise ValueError("a transactional producer is idempotent: do not set "
                                 "enable_idempotence=False with transactional_id")
            enable_idempotence = True
            if not isinstance(transaction_timeout_ms, int) or transaction_timeout_ms < 1:
                raise ValueError(f"transaction_timeout_ms must be an int >= 1, not "
                                 f"{transaction_timeout_ms!r}")
        elif transaction_two_phase_commit:
            raise ValueError("transaction_two_phase_commit needs a transactional_id")
        if enable_idempotence is None:
            # Kafka 3's default: on, unless other settings the user chose
            # rule it out.
            enable_idempotence = (acks == -1 and retries > 0
                                  and max_in_flight <= MAX_IN_FLIGHT_IDEMPOTENT)
        elif enable_idempotence:
            if acks != -1:
                raise ValueError("enable_idempotence=True needs acks='all': an acks=1 write "
                                 "can be lost with its leader, and with it the sequence")
            if retries < 1:
                raise ValueError("enable_idempotence=True needs retries >= 1")
            if not isinstance(max_in_flight, int) or max_in_flight > MAX_IN_FLIGHT_IDEMPOTENT:
                raise ValueError(
                    f"enable_idempotence=True allows max_in_flight up to "
                    f"{MAX_IN_FLIGHT_IDEMPOTENT}, the batches a broker remembers per producer; "
                    f"not {max_in_flight!r}")
        elif not isinstance(enable_idempotence, bool):
            raise TypeError(f"enable_idempotence must be a bool, not {enable_idempotence!r}")
        try:
            compression = Compression[(compression_type or "none").upper()]
        except KeyError:
            raise ValueError(f"compression_type must be 'none' or 'gzip', "
                             f"not {compression_type!r}") from None
        if compression not in (Compression.NONE, Compression.GZIP):
            raise ValueError(f"compression_type {compression_type!r} is not supported; "
                             "use 'none' or 'gzip'")
        for name, value, low in (("linger_ms", linger_ms, 0), ("batch_size", batch_size, 1),
                                 ("buffer_memory", buffer_memory, 1),
                                 ("max_block_ms", max_block_ms, 0), ("retries", retries, 0),
                                 ("retry_backoff_ms", retry_backoff_ms, 0),
                                 ("request_timeout_ms", request_timeout_ms, 1),
                                 ("max_in_flight", max_in_flight, 1),
                                 ("max_request_bytes", max_request_bytes, 1)):
            if not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, not {value!r}")
        if delivery_timeout_ms < linger_ms + request_timeout_ms:
            raise ValueError(
                f"delivery_timeout_ms ({delivery_timeout_ms}) must be at least linger_ms + "
                f"request_timeout_ms ({linger_ms + request_timeout_ms}), as in Kafka: a "
                "batch needs time to wait and one request before it may expire")
        if partitioner is not None and not callable(partitioner):
            raise TypeError("partitioner must be callable(topic, key, num_partitions) -> int")
        self.bootstrap = bootstrap
        self.acks = acks
        self.linger_ms = linger_ms
        self.batch_size = batch_size
        self.buffer_memory = buffer_memory
        self.max_block_ms = max_block_ms
        self.compression = compression
        self.retries = retries
        self.retry_backoff_ms = retry_backoff_ms
        self.delivery_timeout_ms = delivery_timeout_ms
        self.request_timeout_ms = request_timeout_ms
        self.max_in_flight = max_in_flight
        self.max_request_bytes = max_request_bytes
        self.metadata_max_age_ms = metadata_max_age_ms
        self.partitioner = partitioner
        self.enable_idempotence = enable_idempotence
        self.transactional_id = transactional_id
        self.transaction_timeout_ms = transaction_timeout_ms
        #: KIP-939: transactions are prepared here (``prepare_transaction``)
        #: and completed by another process; the coordinator never aborts
        #: them on their timeout.
        self.transaction_two_phase_commit = bool(transaction_two_phase_commit)


class ConsumerConfig:
    """The consumer's settings, checked once. Names as Kafka's, snake_case."""

    def __init__(self, *, bootstrap: str | Iterable[str] = DEFAULT_BOOTSTRAP,
                 auto_offset_reset: str = "latest", fetch_min_bytes: int = 1,
                 fetch_max_wait_ms: int = 500, fetch_max_bytes: int = 50 * 1024 * 1024,
                 max_partition_fetch_bytes: int = 1024 * 1024, max_poll_records: int = 500,
                 max_buffered_bytes: int = 64 * 1024 * 1024, request_timeout_ms: int = 30_000,
                 retry_backoff_ms: int = 100, metadata_max_age_ms: int = 300_000,
                 check_crcs: bool = True, include_headers: bool = True,
                 consumer_timeout_ms: int | None = None, group_id: str | None = None,
                 group_instance_id: str | None = None, session_timeout_ms: int = 45_000,
                 rebalance_timeout_ms: int = 300_000, enable_auto_commit: bool = True,
                 auto_commit_interval_ms: int = 5000,
                 group_remote_assignor: str | None = None,
                 isolation_level: str = "read_uncommitted",
                 security_protocol: str = "PLAINTEXT", ssl_cafile: str | None = None,
                 ssl_certfile: str | None = None, ssl_keyfile: str | None = None,
                 ssl_check_hostname: bool = True, client_id: str | None = None,
                 sasl_mechanism: str | None = None, sasl_plain_username: str | None = None,
                 sasl_plain_password: str | None = None,
                 sasl_oauth_token_provider: Any = None) -> None:
        self.security = Security(security_protocol, ssl_cafile, ssl_certfile, ssl_keyfile,
                                 ssl_check_hostname, sasl_mechanism, sasl_plain_username,
                                 sasl_plain_password, sasl_oauth_token_provider)
        self.client_id = default_client_id("consumer") if client_id is None else client_id
        if isolation_level not in ("read_uncommitted", "read_committed"):
            raise ValueError(f"isolation_level must be 'read_uncommitted' or 'read_committed', "
                             f"not {isolation_level!r}")
        if auto_offset_reset not in ("earliest", "latest", "none"):
            raise ValueError(f"auto_offset_reset must be 'earliest', 'latest' or 'none', "
                             f"not {auto_offset_reset!r}")
        for name, value, low, high in (
                ("fetch_min_bytes", fetch_min_bytes, 0, 2**31 - 1),
                ("fetch_max_wait_ms", fetch_max_wait_ms, 0, 30_000),
                ("fetch_max_bytes", fetch_max_bytes, 1, 2**31 - 1),
                ("max_partition_fetch_bytes", max_partition_fetch_bytes, 1, 2**31 - 1),
                ("max_poll_records", max_poll_records, 1, 10_000_000),
                ("max_buffered_bytes", max_buffered_bytes, 1, 2**40),
                ("request_timeout_ms", request_timeout_ms, 1, 2**31 - 1),
                ("retry_backoff_ms", retry_backoff_ms, 0, 2**31 - 1),
                ("session_timeout_ms", session_timeout_ms, 1, 2**31 - 1),
                ("rebalance_timeout_ms", rebalance_timeout_ms, 0, 2**31 - 1),
                ("auto_commit_interval_ms", auto_commit_interval_ms, 1, 2**31 - 1)):
            if not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"{name} must be an int in [{low}, {high}], not {value!r}")
        self.bootstrap = bootstrap
        self.isolation_level = isolation_level
        self.auto_offset_reset = auto_offset_reset
        self.fetch_min_bytes = fetch_min_bytes
        self.fetch_max_wait_ms = fetch_max_wait_ms
        self.fetch_max_bytes = fetch_max_bytes
        self.max_partition_fetch_bytes = max_partition_fetch_bytes
        self.max_poll_records = max_poll_records
        self.max_buffered_bytes = max_buffered_bytes
        self.request_timeout_ms = request_timeout_ms
        self.retry_backoff_ms = retry_backoff_ms
        self.metadata_max_age_ms = metadata_max_age_ms
        self.check_crcs = check_crcs
        self.include_headers = include_headers
        self.consumer_timeout_ms = consumer_timeout_ms
        if group_id is not None and (not isinstance(group_id, str) or not group_id):
            raise ValueError(f"group_id must be a non-empty str, not {group_id!r}")
        self.group_id = group_id
        self.group_instance_id = group_instance_id
        self.session_timeout_ms = session_timeout_ms
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.enable_auto_commit = bool(enable_auto_commit)
        self.auto_commit_interval_ms = auto_commit_interval_ms
        self.group_remote_assignor = group_remote_assignor
