"""The broker's access rules: every route, the Kafka API it is, and how it
is authorized (kraft/authorizer.py has the rules' meaning and the
middleware). ``BrokerServer`` refuses to start if a route has no rule here.

Checked by the middleware (an operation on the CLUSTER) or, for routes that
touch topics, groups or transactional ids, by their handlers, Kafka's way:
a topic the caller may not DESCRIBE is left out of listings and answers
TOPIC_AUTHORIZATION_FAILED when named, whether or not it exists.
"""

from __future__ import annotations

from typing import Callable

from kraft.authorizer import RequestAuth, RouteRule
from protocol import acl
from protocol.acl import (ALTER, ALTER_CONFIGS, CLUSTER_ACTION, DESCRIBE, DESCRIBE_CONFIGS,
                          TOPIC)


def _rule(api: str, cluster_op: str | None = None) -> RouteRule:
    return RouteRule(api, cluster_op, per_resource=cluster_op is None)


BROKER_ROUTE_RULES: dict[tuple[str, str], RouteRule] = {
    # data plane (data_api.py)
    ("POST", "/v1/produce"): _rule("Produce"),
    ("POST", "/v1/fetch"): _rule("Fetch"),
    ("GET", "/v1/replica/fetch-stream"): _rule("Fetch (a follower's stream)", CLUSTER_ACTION),
    ("GET", "/v1/stream"): _rule("Produce and Fetch (a client's stream)"),
    ("POST", "/v1/offsets"): _rule("ListOffsets"),
    ("POST", "/v1/txn/markers"): _rule("WriteTxnMarkers", CLUSTER_ACTION),
    ("POST", "/v1/metadata"): _rule("Metadata"),
    ("GET", "/v1/metadata"): _rule("Metadata"),
    # REST proxy (rest_proxy.py): checked at the broker the client called
    ("POST", "/topics/{topic}"): _rule("Produce"),
    ("GET", "/topics/{topic}/partitions/{partition}/records"): _rule("Fetch"),
    ("GET", "/topics/{topic}/partitions/{partition}/offsets"): _rule("ListOffsets"),
    # consumer groups (groups/api.py)
    ("POST", "/v1/groups/coordinator"): _rule("FindCoordinator"),
    ("POST", "/v1/groups/heartbeat"): _rule("ConsumerGroupHeartbeat"),
    ("POST", "/v1/groups/watch"): _rule("ConsumerGroupHeartbeat (watch)"),
    ("POST", "/v1/groups/offsets/commit"): _rule("OffsetCommit"),
    ("POST", "/v1/groups/offsets/fetch"): _rule("OffsetFetch"),
    ("POST", "/v1/groups/offsets/txn_commit"): _rule("TxnOffsetCommit"),
    ("POST", "/v1/admin/groups/delete"): _rule("DeleteGroups"),
    ("POST", "/v1/admin/groups/offsets/reset"): _rule("AlterConsumerGroupOffsets"),
    ("GET", "/v1/groups"): _rule("ListGroups"),
    ("GET", "/v1/groups/{group}"): _rule("DescribeGroups"),
    # producers and transactions (producers.py, transactions/service.py)
    ("POST", "/v1/producers/init"): _rule("InitProducerId"),
    ("POST", "/v1/transactions/coordinator"): _rule("FindCoordinator"),
    ("POST", "/v1/transactions/add_partitions"): _rule("AddPartitionsToTxn"),
    ("POST", "/v1/transactions/end"): _rule("EndTxn"),
    ("POST", "/v1/transactions/verify"): _rule("AddPartitionsToTxn (verify)", CLUSTER_ACTION),
    ("POST", "/v1/admin/transactions/abort"): _rule("AbortTransaction", ALTER),
    ("GET", "/v1/transactions"): _rule("ListTransactions"),
    ("GET", "/v1/transactions/{transactional_id}"): _rule("DescribeTransactions"),
    # admin (server.py; forwarded to the controller)
    ("POST", "/v1/admin/topics/create"): _rule("CreateTopics"),
    ("POST", "/v1/admin/topics/delete"): _rule("DeleteTopics"),
    ("POST", "/v1/admin/topics/describe"): _rule("Metadata + DescribeConfigs"),
    ("POST", "/v1/admin/partitions/create"): _rule("CreatePartitions"),
    ("POST", "/v1/admin/configs/describe"): _rule("DescribeConfigs"),
    ("POST", "/v1/admin/configs/alter"): _rule("IncrementalAlterConfigs"),
    ("POST", "/v1/admin/leaders/elect"): _rule("ElectLeaders", ALTER),
    ("POST", "/v1/admin/partitions/reassign"): _rule("AlterPartitionReassignments", ALTER),
    ("POST", "/v1/admin/partitions/reassignments"): _rule("ListPartitionReassignments",
                                                          DESCRIBE),
    ("POST", "/v1/admin/quotas/alter"): _rule("AlterClientQuotas", ALTER_CONFIGS),
    ("POST", "/v1/admin/quotas/describe"): _rule("DescribeClientQuotas", DESCRIBE_CONFIGS),
    ("POST", "/v1/admin/users/alter"): _rule("AlterUserScramCredentials", ALTER),
    ("POST", "/v1/admin/users/describe"): _rule("DescribeUserScramCredentials", DESCRIBE),
    ("POST", "/v1/admin/acls/create"): _rule("CreateAcls", ALTER),
    ("POST", "/v1/admin/acls/delete"): _rule("DeleteAcls", ALTER),
    ("POST", "/v1/admin/acls/describe"): _rule("DescribeAcls", DESCRIBE),
    # delegation tokens: any user authenticated by password or certificate,
    # for tokens of its own (the handler checks)
    ("POST", "/v1/admin/tokens/create"): _rule("CreateDelegationToken"),
    ("POST", "/v1/admin/tokens/renew"): _rule("RenewDelegationToken"),
    ("POST", "/v1/admin/tokens/expire"): _rule("ExpireDelegationToken"),
    ("POST", "/v1/admin/tokens/describe"): _rule("DescribeDelegationToken"),
    # the web console's page, script and style (console.py): no data in them
    ("GET", "/ui"): RouteRule("console", open=True),
    ("GET", "/ui/"): RouteRule("console", open=True),
    ("GET", "/ui/static/{name}"): RouteRule("console", open=True),
    # inspection (server.py)
    ("GET", "/healthz"): RouteRule("health", open=True),
    ("GET", "/metrics"): _rule("metrics", DESCRIBE),
    ("GET", "/v1/cluster"): RouteRule("DescribeCluster", open=True),
    ("GET", "/v1/brokers"): RouteRule("DescribeCluster", open=True),
    ("GET", "/v1/topics"): _rule("Metadata"),
    ("GET", "/v1/topics/{topic}"): _rule("Metadata + DescribeConfigs"),
    ("GET", "/v1/quorum"): _rule("DescribeQuorum", DESCRIBE),
    ("GET", "/v1/log-dirs"): _rule("DescribeLogDirs", DESCRIBE),
    ("GET", "/v1/metrics/topics"): _rule("Metrics (per topic)", DESCRIBE),
}


def topic_filter(auth: RequestAuth, operation: str = DESCRIBE) -> Callable[[str], bool]:
    """Whether the caller may ``operation`` (DESCRIBE: see) a topic."""
    if not auth.enabled:
        return lambda _name: True
    return lambda name: auth.allowed(operation, TOPIC, name)


def require_topics(auth: RequestAuth, operation: str, topics, what: str = "") -> None:
    """Refuse the whole request unless the caller may ``operation`` every
    one of ``topics`` (admin requests: all or nothing, naming the first
    refused)."""
    if auth.enabled:
        for topic in topics:
            auth.require(operation, TOPIC, topic, what)


def require_cluster_or_topics(auth: RequestAuth, operation: str, topics,
                              what: str = "") -> None:
    """``operation`` on the CLUSTER covers every topic (CreateTopics)."""
    if auth.enabled and not auth.allowed(operation, acl.CLUSTER, acl.CLUSTER_NAME):
        require_topics(auth, operation, topics, what)
