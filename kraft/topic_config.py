"""The topic-level configs the controller accepts, with their defaults.

Who uses it:
  - the controller (``kraft/controller.py``) validates and normalises the
    ``configs`` of CreateTopics and the ops of AlterConfigs before it writes
    them as ``ConfigRecord`` values, and answers DescribeConfigs from the
    registry's keys and defaults;
  - the node start-up code turns its broker-level settings (``log.retention.ms``,
    ``min.insync.replicas``, ...) into topic-level defaults with
    ``defaults_from_broker_config``;
  - whoever elects leaders asks ``unclean_election_enabled``.

Values are stored as strings, normalised so that equal settings are equal
strings: integers in decimal (``"1_000"`` and ``1000`` both become
``"1000"``), booleans as ``"true"`` / ``"false"``. A value is refused with
``protocol.errors.InvalidConfigError`` naming the key and the rule.

The log keys (``segment.bytes``, ``retention.ms``, ...) are exactly the ones
``storage.config.LogConfig`` understands, and they are validated by building
a ``LogConfig``, so the controller never accepts a value a broker's log
would refuse.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, Mapping

from kraft.image import TOPIC_RESOURCE
from protocol.errors import InvalidConfigError
from protocol.fields import printable
from storage import errors as storage_errors
from storage.config import BROKER_TO_TOPIC_KEYS, LogConfig
from storage.config import TOPIC_KEYS as LOG_TOPIC_KEYS

if TYPE_CHECKING:
    from kraft.image import MetadataImage

# A limit on everything: no stored value is longer than this.
CONFIG_VALUE_CHARS_MAX = 1024
# Configs are Kafka longs at most; larger integers are refused before they
# reach any arithmetic or formatting.
CONFIG_INT_MIN = -(2**63)
CONFIG_INT_MAX = 2**63 - 1
INT32_MAX = 2**31 - 1

MIN_INSYNC_REPLICAS = "min.insync.replicas"
UNCLEAN_LEADER_ELECTION_ENABLE = "unclean.leader.election.enable"
CLEANUP_POLICY = "cleanup.policy"


@dataclasses.dataclass(frozen=True)
class TopicConfigKey:
    """One accepted key: its built-in default and how to check a value.

    ``normalise`` takes a value as a request carries it (str, int or bool)
    and returns its canonical string, or raises ``InvalidConfigError``.
    ``broker_key`` is the node-level setting that gives the default, if any.
    """

    name: str
    default: str
    normalise: Callable[[Any], str]
    broker_key: str | None
    doc: str


def _check_scalar(key: str, value: Any) -> None:
    """Refuse what no key accepts: other types, overlong strings, huge ints."""
    if isinstance(value, bool):
        return
    if isinstance(value, int):
        if not CONFIG_INT_MIN <= value <= CONFIG_INT_MAX:
            raise InvalidConfigError(f"{key} must fit in a 64-bit signed integer")
        return
    if isinstance(value, str):
        if len(value) > CONFIG_VALUE_CHARS_MAX:
            raise InvalidConfigError(
                f"{key} value is {len(value)} characters long; the limit is "
                f"{CONFIG_VALUE_CHARS_MAX}")
        return
    raise InvalidConfigError(
        f"{key} must be a string, an integer or a boolean, not {type(value).__name__}")


def _log_normaliser(key: str) -> Callable[[Any], str]:
    """A normaliser that lets ``LogConfig`` judge one log key's value."""

    def normalise(value: Any) -> str:
        _check_scalar(key, value)
        number = _log_config({key: value}).to_mapping()[key]
        if not CONFIG_INT_MIN <= number <= CONFIG_INT_MAX:
            raise InvalidConfigError(f"{key} must fit in a 64-bit signed integer")
        return str(number)

    return normalise


def _log_config(settings: Mapping[str, Any]) -> LogConfig:
    """``LogConfig.from_mapping`` with storage's error turned into ours."""
    try:
        return LogConfig.from_mapping(settings)
    except storage_errors.InvalidConfigError as exc:
        raise InvalidConfigError(str(exc)) from None


def _normalise_min_insync_replicas(value: Any) -> str:
    _check_scalar(MIN_INSYNC_REPLICAS, value)
    number = _parse_int(MIN_INSYNC_REPLICAS, value)
    if not 1 <= number <= INT32_MAX:
        raise InvalidConfigError(
            f"{MIN_INSYNC_REPLICAS} = {number} is invalid: it must be between 1 and {INT32_MAX}")
    return str(number)


def _normalise_bool(key: str) -> Callable[[Any], str]:
    def normalise(value: Any) -> str:
        _check_scalar(key, value)
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower()
        raise InvalidConfigError(f"{key} must be true or false, got {printable(value)}")

    return normalise


def _normalise_cleanup_policy(value: Any) -> str:
    _check_scalar(CLEANUP_POLICY, value)
    policy = value.strip().lower() if isinstance(value, str) else None
    if policy == "delete":
        return policy
    if policy is not None and "compact" in policy:
        raise InvalidConfigError(
            f"{CLEANUP_POLICY} = {printable(value)} is not supported yet: log compaction is "
            "not implemented, so the only accepted policy is 'delete'")
    raise InvalidConfigError(
        f"{CLEANUP_POLICY} must be 'delete', got {printable(value)}")


def _parse_int(key: str, value: Any) -> int:
    if isinstance(value, bool):
        raise InvalidConfigError(f"{key} must be an integer, not a boolean")
    if isinstance(value, int):
        return value
    try:
        return int(value.strip())
    except ValueError:
        raise InvalidConfigError(f"{key} must be an integer, got {printable(value)}") from None


def _build_registry() -> dict[str, TopicConfigKey]:
    """Every accepted key. Log keys take their defaults from ``LogConfig()``."""
    log_defaults = LogConfig().to_mapping()
    log_broker_keys = _log_broker_keys()
    registry = {
        key: TopicConfigKey(key, str(log_defaults[key]), _log_normaliser(key),
                            log_broker_keys.get(key), f"partition log setting {key}")
        for key in LOG_TOPIC_KEYS
    }
    registry[MIN_INSYNC_REPLICAS] = TopicConfigKey(
        MIN_INSYNC_REPLICAS, "1", _normalise_min_insync_replicas, MIN_INSYNC_REPLICAS,
        "in-sync replicas an acks=all produce needs")
    registry[UNCLEAN_LEADER_ELECTION_ENABLE] = TopicConfigKey(
        UNCLEAN_LEADER_ELECTION_ENABLE, "false", _normalise_bool(UNCLEAN_LEADER_ELECTION_ENABLE),
        UNCLEAN_LEADER_ELECTION_ENABLE, "may an out-of-sync replica become leader")
    registry[CLEANUP_POLICY] = TopicConfigKey(
        CLEANUP_POLICY, "delete", _normalise_cleanup_policy, "log.cleanup.policy",
        "what happens to old segments (only delete for now)")
    return dict(sorted(registry.items()))


def _log_broker_keys() -> dict[str, str]:
    return {topic_key: broker_key for broker_key, topic_key in BROKER_TO_TOPIC_KEYS.items()}


TOPIC_CONFIGS: dict[str, TopicConfigKey] = _build_registry()
TOPIC_CONFIG_KEYS: frozenset[str] = frozenset(TOPIC_CONFIGS)


def builtin_defaults() -> dict[str, str]:
    """Every key with its built-in default (what a node without settings uses)."""
    return {key: entry.default for key, entry in TOPIC_CONFIGS.items()}


def normalise_topic_config(key: Any, value: Any) -> str:
    """One value of one key -> its canonical string; InvalidConfigError if
    the key is unknown or the value is refused."""
    if not isinstance(key, str):
        raise InvalidConfigError(f"config names must be strings, got {printable(key)}")
    entry = TOPIC_CONFIGS.get(key)
    if entry is None:
        raise InvalidConfigError(
            f"unknown topic config {printable(key)}; known: {', '.join(TOPIC_CONFIGS)}")
    return entry.normalise(value)


def validate_topic_configs(configs: Mapping[str, Any]) -> dict[str, str]:
    """Check a set of topic overrides, each alone and all together, and
    return them normalised (sorted by key). Raises ``InvalidConfigError``."""
    if not isinstance(configs, Mapping):
        raise InvalidConfigError(f"topic configs must be a map, got {type(configs).__name__}")
    normalised = {key: normalise_topic_config(key, value)
                  for key, value in sorted(configs.items(), key=lambda kv: str(kv[0]))}
    # Checked together too, so a future rule between two log keys is kept.
    _log_config({key: value for key, value in normalised.items() if key in LOG_TOPIC_KEYS})
    return normalised


def defaults_from_broker_config(node_settings: Mapping[str, Any]) -> dict[str, str]:
    """Topic defaults from a node's broker-level settings: every registry key,
    the node's value where it sets the matching broker key (``log.retention.ms``
    -> ``retention.ms``, also ``log.retention.hours`` and friends), the
    built-in default otherwise. Unrelated node keys are ignored."""
    try:
        log_defaults = LogConfig.from_broker_config(node_settings).to_mapping()
    except storage_errors.InvalidConfigError as exc:
        raise InvalidConfigError(str(exc)) from None
    defaults = builtin_defaults()
    defaults.update({key: TOPIC_CONFIGS[key].normalise(value)
                     for key, value in log_defaults.items()})
    for key, entry in TOPIC_CONFIGS.items():
        if key not in LOG_TOPIC_KEYS and entry.broker_key in node_settings:
            defaults[key] = entry.normalise(node_settings[entry.broker_key])
    return defaults


def unclean_election_enabled(image: "MetadataImage", topic: str, cluster_default: bool) -> bool:
    """Whether ``topic`` may elect an out-of-sync leader: its override of
    ``unclean.leader.election.enable`` if it has one, else ``cluster_default``.

    An override that no longer parses (written by a buggy or older
    controller) counts as absent rather than stopping elections."""
    override = image.configs.get((TOPIC_RESOURCE, topic), {}).get(UNCLEAN_LEADER_ELECTION_ENABLE)
    if override is None:
        return cluster_default
    try:
        return normalise_topic_config(UNCLEAN_LEADER_ELECTION_ENABLE, override) == "true"
    except InvalidConfigError:
        return cluster_default
