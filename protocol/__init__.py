"""What the control plane, the brokers and the client all speak.

``wire`` (HTTP bodies in msgpack or JSON, error bodies and their statuses,
the error middleware), ``fields`` (checking request fields), ``errors`` (the
one catalogue of error codes), ``partitioner`` (Kafka's murmur2, so a keyed
record lands in the same partition whoever computes it), and the names of
partitions. It imports nothing of ours but ``storage``'s definitions of those
names, so every other package may use it.
"""

from storage.names import TOPIC_NAME_MAX_CHARS, TopicPartition, validate_topic_name

#: Where clients look for a broker when told nothing else (Kafka's port).
DEFAULT_BOOTSTRAP = "http://127.0.0.1:9092"

__all__ = ["DEFAULT_BOOTSTRAP", "TOPIC_NAME_MAX_CHARS", "TopicPartition", "validate_topic_name"]
