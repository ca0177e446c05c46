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
``"1000"``), booleans as ``"true"`` / ``"false"``, fractions in positional
decimal (``min.cleanable.dirty.ratio``: ``".5"``, ``0.5`` and ``"5e-1"``
all become ``"0.5"``; ``1`` becomes ``"1.0"``), ``cleanup.policy`` as one of
``"delete"``, ``"compact"``, ``"compact,delete"`` (``"Delete, Compact"``
becomes ``"compact,delete"``). A value is refused with
``protocol.errors.InvalidConfigError`` naming the key and the rule.

The log keys (``segment.bytes``, ``retention.ms``, ``cleanup.policy``, ...)
are exactly the ones ``storage.config.LogConfig`` understands, and they are
validated by building a ``LogConfig``, so the controller never accepts a
value a broker's log would refuse; rules between keys
(``max.compaction.lag.ms`` at least ``min.compaction.lag.ms``) are checked on
a topic's overrides together with the cluster defaults they combine with.
"""

from __future__ import annotations

import dataclasses
from decimal import Decimal
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


@dataclasses.dataclass(frozen=True)
class TopicConfigKey:
    """One accepted key: its built-in default and how to check a value.

    ``normalise`` takes a value as a request carries it (str, int, float,
    bool, or a list of str) and returns its canonical string, or raises
    ``InvalidConfigError``.
    ``broker_key`` is the node-level setting that gives the default, if any.
    """

    name: str
    default: str
    normalise: Callable[[Any], str]
    broker_key: str | None
    doc: str


def _check_scalar(key: str, value: Any) -> None:
    """Refuse what no key accepts: other types, overlong strings, huge ints.
    A float, or a list of strings (``cleanup.policy`` as Kafka's list type),
    passes here; the keys that take neither refuse it."""
    if isinstance(value, (bool, float)):
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
    if isinstance(value, (list, tuple)) and all(isinstance(item, str) for item in value):
        chars = sum(len(item) + 1 for item in value)  # as a comma-separated string
        if chars > CONFIG_VALUE_CHARS_MAX + 1:
            raise InvalidConfigError(
                f"{key} value is {chars - 1} characters long as a list; the limit is "
                f"{CONFIG_VALUE_CHARS_MAX}")
        return
    raise InvalidConfigError(
        f"{key} must be a string, a number, a boolean or a list of strings, not "
        f"{type(value).__name__}")


def _log_normaliser(key: str) -> Callable[[Any], str]:
    """A normaliser that lets ``LogConfig`` judge one log key's value."""

    def normalise(value: Any) -> str:
        _check_scalar(key, value)
        return _canonical(key, _log_config({key: value}).to_mapping()[key])

    return normalise


def _canonical(key: str, typed: int | float | str) -> str:
    """A ``LogConfig`` value as its stored string: a str as it is (the
    policy is canonical already), a float in positional decimal with the
    fewest digits that read back the same (``0.5``, ``1e-05`` ->
    ``0.00001``), an int in decimal within a Kafka long."""
    if isinstance(typed, str):
        return typed
    if isinstance(typed, float):
        return format(Decimal(repr(typed)), "f")
    if not CONFIG_INT_MIN <= typed <= CONFIG_INT_MAX:
        raise InvalidConfigError(f"{key} must fit in a 64-bit signed integer")
    return str(typed)


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


def _parse_int(key: str, value: Any) -> int:
    if isinstance(value, bool):
        raise InvalidConfigError(f"{key} must be an integer, not a boolean")
    if isinstance(value, int):
        return value
    try:
        return int(value.strip())
    except (AttributeError, ValueError):  # not a string (a float, a list), or not a number
        raise InvalidConfigError(f"{key} must be an integer, got {printable(value)}") from None


def _build_registry() -> dict[str, TopicConfigKey]:
    """Every accepted key. Log keys take their defaults from ``LogConfig()``."""
    log_defaults = LogConfig().to_mapping()
    log_broker_keys = _log_broker_keys()
    registry = {
        key: TopicConfigKey(key, _canonical(key, log_defaults[key]), _log_normaliser(key),
                            log_broker_keys.get(key), f"partition log setting {key}")
        for key in LOG_TOPIC_KEYS
    }
    registry[MIN_INSYNC_REPLICAS] = TopicConfigKey(
        MIN_INSYNC_REPLICAS, "1", _normalise_min_insync_replicas, MIN_INSYNC_REPLICAS,
        "in-sync replicas an acks=all produce needs")
    registry[UNCLEAN_LEADER_ELECTION_ENABLE] = TopicConfigKey(
        UNCLEAN_LEADER_ELECTION_ENABLE, "false", _normalise_bool(UNCLEAN_LEADER_ELECTION_ENABLE),
        UNCLEAN_LEADER_ELECTION_ENABLE, "may an out-of-sync replica become leader")
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


def validate_topic_configs(configs: Mapping[str, Any],
                           defaults: Mapping[str, str] | None = None) -> dict[str, str]:
    """Check a set of topic overrides, each alone and all together, and
    return them normalised (sorted by key). Raises ``InvalidConfigError``.

    The rules between keys (``max.compaction.lag.ms`` >= ``min.compaction.lag.ms``)
    hold among the overrides, and, given the cluster's topic ``defaults``
    (normalised, as ``defaults_from_broker_config`` makes them), between
    the overrides and the defaults of the keys they leave unset, as the
    broker's log will combine them (Kafka checks a topic config against the
    broker's defaults too)."""
    if not isinstance(configs, Mapping):
        raise InvalidConfigError(f"topic configs must be a map, got {type(configs).__name__}")
    normalised = {key: normalise_topic_config(key, value)
                  for key, value in sorted(configs.items(), key=lambda kv: str(kv[0]))}
    log_overrides = {key: value for key, value in normalised.items() if key in LOG_TOPIC_KEYS}
    _log_config(log_overrides)
    if defaults:
        combined = {key: value for key, value in defaults.items() if key in LOG_TOPIC_KEYS}
        combined.update(log_overrides)
        try:
            LogConfig.from_mapping(combined)
        except storage_errors.InvalidConfigError as exc:
            raise InvalidConfigError(
                f"{exc} (this topic's overrides combined with the cluster's defaults for "
                "the keys it does not set)") from None
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
