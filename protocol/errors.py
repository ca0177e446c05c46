"""Every error the API reports, defined once, each with its stable code
(Kafka's name where the meaning is the same): the control plane's first,
then the data plane's. ``protocol/wire.py`` gives each code its HTTP status
and turns any of them into the error body ``{"error": {"code", "message",
...}}``; the client turns that body back into its own exception types."""


#: Codes a client retries, after refreshing metadata (docs/protocol.md).
RETRIABLE_CODES = frozenset({
    "NOT_LEADER_OR_FOLLOWER",
    "UNKNOWN_TOPIC_OR_PARTITION",
    "LEADER_NOT_AVAILABLE",
    "FENCED_LEADER_EPOCH",
    "UNKNOWN_LEADER_EPOCH",
    "REQUEST_TIMED_OUT",
    "NOT_ENOUGH_REPLICAS",
    "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
    "NOT_CONTROLLER",
    "BROKER_NOT_AVAILABLE",
    "KAFKA_STORAGE_ERROR",
})


class KraftError(Exception):
    """Base class: a request a controller or broker refuses, with a reason."""

    code = "UNKNOWN_SERVER_ERROR"


class SslAuthenticationError(KraftError):
    """A TLS listener that requires a client certificate got none."""

    code = "SSL_AUTHENTICATION_FAILED"


class SaslAuthenticationError(KraftError):
    """A SASL listener got no credentials, or wrong ones."""

    code = "SASL_AUTHENTICATION_FAILED"


class BrokerNotAvailableError(KraftError):
    """This node cannot serve the request yet: retriable."""

    code = "BROKER_NOT_AVAILABLE"


class ClusterAuthorizationFailedError(KraftError):
    """The client may not do this to the cluster."""

    code = "CLUSTER_AUTHORIZATION_FAILED"


class TopicAuthorizationFailedError(KraftError):
    """The caller may not do this to the topic (an ACL). Not retriable. A
    topic the caller may not describe answers this whether or not it exists."""

    code = "TOPIC_AUTHORIZATION_FAILED"


class GroupAuthorizationFailedError(KraftError):
    """The caller may not do this to the consumer group (an ACL). Not retriable."""

    code = "GROUP_AUTHORIZATION_FAILED"


class TransactionalIdAuthorizationFailedError(KraftError):
    """The caller may not use this transactional id (an ACL). Not retriable."""

    code = "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"


class SecurityDisabledError(KraftError):
    """ACLs are asked for where no authorizer is configured
    (``authorizer.class.name``)."""

    code = "SECURITY_DISABLED"


class DelegationTokenNotFoundError(KraftError):
    """No such delegation token (or its HMAC is not the one given)."""

    code = "DELEGATION_TOKEN_NOT_FOUND"


class DelegationTokenExpiredError(KraftError):
    code = "DELEGATION_TOKEN_EXPIRED"


class DelegationTokenOwnerMismatchError(KraftError):
    """Only a token's owner and renewers may renew or expire it."""

    code = "DELEGATION_TOKEN_OWNER_MISMATCH"


class DelegationTokenAuthDisabledError(KraftError):
    """No ``delegation.token.secret.key.file``: the cluster makes no tokens."""

    code = "DELEGATION_TOKEN_AUTH_DISABLED"


class DelegationTokenRequestNotAllowedError(KraftError):
    """Tokens are made by authenticated users, not by tokens nor anonymous callers."""

    code = "DELEGATION_TOKEN_REQUEST_NOT_ALLOWED"


class ResourceNotFoundError(KraftError):
    """A user (or other named resource) that does not exist."""

    code = "RESOURCE_NOT_FOUND"


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



class IneligibleReplicaError(KraftError):
    """AlterPartition tried to add a replica that is fenced or shutting down."""

    code = "INELIGIBLE_REPLICA"


class NoReassignmentInProgressError(KraftError):
    """A request cancels the reassignment of a partition that has none
    under way."""

    code = "NO_REASSIGNMENT_IN_PROGRESS"


# -- the data plane ---------------------------------------------------------------
class NotLeaderOrFollowerError(KraftError):
    """This broker does not lead the partition. Carries what the broker's
    metadata says of the current leader, so the client can go straight there."""

    code = "NOT_LEADER_OR_FOLLOWER"

    def __init__(self, message: str, leader_id: int | None = None,
                 leader_epoch: int | None = None, leader_url: str | None = None) -> None:
        super().__init__(message)
        self.leader_id = leader_id
        self.leader_epoch = leader_epoch
        self.leader_url = leader_url


class LeaderNotAvailableError(NotLeaderOrFollowerError):
    """The partition has no leader right now (its replicas are all down)."""

    code = "LEADER_NOT_AVAILABLE"


class InvalidRequiredAcksError(KraftError):
    code = "INVALID_REQUIRED_ACKS"


class FencedLeaderEpochError(KraftError):
    """The caller believes in an older leader epoch than this leader's."""

    code = "FENCED_LEADER_EPOCH"


class UnknownLeaderEpochError(KraftError):
    """The caller believes in a newer leader epoch than this broker knows:
    this broker's metadata lags; retry shortly."""

    code = "UNKNOWN_LEADER_EPOCH"


class NotEnoughReplicasError(KraftError):
    """An ``acks=all`` write refused before it was appended: the ISR is
    smaller than the topic's ``min.insync.replicas``."""

    code = "NOT_ENOUGH_REPLICAS"


class NotEnoughReplicasAfterAppendError(KraftError):
    """An ``acks=all`` write that was appended and replicated to the ISR, but
    the ISR shrank below ``min.insync.replicas`` meanwhile: it is not
    acknowledged as durable (a retry may duplicate it)."""

    code = "NOT_ENOUGH_REPLICAS_AFTER_APPEND"


class ReplicationTimedOutError(KraftError):
    """An ``acks=all`` write that did not reach every ISR member within
    ``timeout_ms``. Its outcome is unknown: it may still commit."""

    code = "REQUEST_TIMED_OUT"


class CodedError(KraftError):
    """An error whose code is known only at run time (relayed from another
    layer, such as the group coordinator's core or a failed internal write)."""

    def __init__(self, code: str, message: str, **extras: object) -> None:
        super().__init__(message)
        self.code = code
        for name, value in extras.items():
            setattr(self, name, value)


class NotCoordinatorError(KraftError):
    """This broker does not coordinate the group; the body names who does."""

    code = "NOT_COORDINATOR"

    def __init__(self, message: str, coordinator_id: int | None = None,
                 coordinator_url: str | None = None) -> None:
        super().__init__(message)
        self.coordinator_id = coordinator_id
        self.coordinator_url = coordinator_url


class CoordinatorLoadInProgressError(KraftError):
    """This broker just became the group's coordinator and is still reading
    the group's state from ``__consumer_offsets``; retry shortly."""

    code = "COORDINATOR_LOAD_IN_PROGRESS"


class CoordinatorNotAvailableError(KraftError):
    """No broker can coordinate the group right now (``__consumer_offsets``
    has no leader for its partition, or could not be created); retry."""

    code = "COORDINATOR_NOT_AVAILABLE"
