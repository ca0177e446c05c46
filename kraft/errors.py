"""Errors of the control plane, each with the stable code the API reports
(Kafka's name where the meaning is the same)."""


class KraftError(Exception):
    """Base class: a request the controller refuses, with a reason."""

    code = "UNKNOWN_SERVER_ERROR"


class InvalidRecordError(KraftError):
    """A metadata record that does not decode or names an unknown type."""

    code = "INVALID_RECORD"


class MetadataApplyError(KraftError):
    """A record inconsistent with the image it is applied to. Every replica
    holds the same image, so every replica refuses it alike."""

    code = "INVALID_RECORD"


class InvalidTopicError(KraftError):
    code = "INVALID_TOPIC_EXCEPTION"


class TopicAlreadyExistsError(KraftError):
    code = "TOPIC_ALREADY_EXISTS"


class UnknownTopicOrPartitionError(KraftError):
    code = "UNKNOWN_TOPIC_OR_PARTITION"


class InvalidPartitionsError(KraftError):
    code = "INVALID_PARTITIONS"


class InvalidReplicationFactorError(KraftError):
    code = "INVALID_REPLICATION_FACTOR"


class InvalidConfigError(KraftError):
    code = "INVALID_CONFIG"


class NotControllerError(KraftError):
    """This controller is not the Raft leader; ``leader_id`` hints at who is."""

    code = "NOT_CONTROLLER"

    def __init__(self, message: str, leader_id: int | None = None) -> None:
        super().__init__(message)
        self.leader_id = leader_id


class BrokerIdNotRegisteredError(KraftError):
    code = "BROKER_ID_NOT_REGISTERED"


class StaleBrokerEpochError(KraftError):
    code = "STALE_BROKER_EPOCH"


class InvalidUpdateVersionError(KraftError):
    """AlterPartition against a partition epoch that is no longer current."""

    code = "INVALID_UPDATE_VERSION"


class FencedLeaderEpochError(KraftError):
    code = "FENCED_LEADER_EPOCH"


class NotLeaderOrFollowerError(KraftError):
    code = "NOT_LEADER_OR_FOLLOWER"


class InvalidRequestError(KraftError):
    code = "INVALID_REQUEST"


class RequestTimedOutError(KraftError):
    """The quorum did not commit the request's records in time. The outcome is
    unknown: the records may still commit (as with Kafka's REQUEST_TIMED_OUT)."""

    code = "REQUEST_TIMED_OUT"


class UnknownServerError(KraftError):
    code = "UNKNOWN_SERVER_ERROR"


class DuplicateBrokerRegistrationError(KraftError):
    """Another live process registered this broker id with a different
    incarnation: two brokers are configured with the same ``node.id``."""

    code = "DUPLICATE_BROKER_REGISTRATION"


class UnknownLeaderEpochError(KraftError):
    """A request names a leader epoch newer than the controller's: the
    sender is ahead of the metadata, which is a bug or a corrupt request."""

    code = "UNKNOWN_LEADER_EPOCH"


class IneligibleReplicaError(KraftError):
    """AlterPartition tried to add a replica that is fenced or shutting down."""

    code = "INELIGIBLE_REPLICA"


class NoReassignmentInProgressError(KraftError):
    """A request cancels the reassignment of a partition that has none
    under way."""

    code = "NO_REASSIGNMENT_IN_PROGRESS"
