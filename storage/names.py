"""Names of partitions: the topic-partition pair, and which topic names are valid.

Defined once here, at the bottom of the layers, because every part names
partitions: the log manager (directory names), the broker, the controller and
the client (``protocol`` re-exports both for them).
"""

from __future__ import annotations

import re
from typing import NamedTuple

from storage.errors import InvalidTopicError

TOPIC_NAME_MAX_CHARS = 249
_TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]+$")


class TopicPartition(NamedTuple):
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


def validate_topic_name(name: str) -> None:
    """Kafka's rule: 1-249 characters of ``[A-Za-z0-9._-]``, not ``.``/``..``."""
    if not isinstance(name, str) or not name:
        raise InvalidTopicError("topic name must be a non-empty string")
    if len(name) > TOPIC_NAME_MAX_CHARS:
        raise InvalidTopicError(
            f"topic name is {len(name)} characters long; the limit is {TOPIC_NAME_MAX_CHARS}")
    if name in (".", ".."):
        raise InvalidTopicError(f"topic name cannot be {name!r}")
    if not _TOPIC_NAME.match(name):
        raise InvalidTopicError(
            f"topic name {name!r} may only contain ASCII letters, digits, '.', '_' and '-'")
