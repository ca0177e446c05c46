"""The admin client's requests and its per-topic error handling, against a
stand-in broker that records what it was asked and answers as scripted."""

import pytest

from api.client import (
    AsyncAdmin, ConfigEntry, KraftlogError, NewTopic, PartitionReassignment,
    TopicAlreadyExistsError, TopicPartition)

URL = "http://a:1"


class ScriptedBroker:
    def __init__(self, answers):
        self.answers = answers  # path -> answer, or a list of answers/errors in turn
        self.requests = []

    async def request(self, url, path, body=None, *, timeout_ms=None, method="POST"):
        self.requests.append((path, body))
        answer = self.answers[path]
        if isinstance(answer, list):
            answer = answer.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def close(self):
        pass


def admin_with(answers):
    admin = AsyncAdmin(URL, retry_backoff_ms=1)
    admin._transport = admin._metadata.transport = broker = ScriptedBroker(answers)
    return admin, broker


def created(name, error=None):
    return {"name": name, "topic_id": "id", "num_partitions": 3, "replication_factor": 1,
            "configs": {}, "error": error}


async def test_create_topics_sends_defaults_for_plain_names_and_raises_the_first_error():
    exists = {"code": "TOPIC_ALREADY_EXISTS", "message": "exists"}
    admin, broker = admin_with({"/v1/admin/topics/create": [
        {"topics": [created("a"), created("b", exists)]},
        {"topics": [created("a"), created("b", exists)]}]})
    with pytest.raises(TopicAlreadyExistsError):
        await admin.create_topics(["a", NewTopic("b", 3, 1, {"retention.ms": "1"},
                                                 replica_assignments={0: [1]})])
    path, body = broker.requests[0]
    assert body["topics"][0] == {"name": "a", "num_partitions": -1, "replication_factor": -1,
                                 "configs": {}}
    assert body["topics"][1]["assignments"] == {0: [1]} and not body["validate_only"]
    results = await admin.create_topics(["a", "b"], raise_on_error=False)
    assert results["a"].error is None and results["a"].num_partitions == 3
    assert results["b"].error.code == "TOPIC_ALREADY_EXISTS"


async def test_alter_configs_sets_and_deletes_and_raises_the_resource_error():
    admin, broker = admin_with({"/v1/admin/configs/alter": [
        {"resources": [{"type": "topic", "name": "t", "error": None}]},
        {"resources": [{"type": "topic", "name": "t", "error": {
            "code": "INVALID_CONFIG", "message": "bad value"}}]}]})
    await admin.alter_configs("t", {"retention.ms": 5, "cleanup.policy": None})
    assert broker.requests[0][1]["resources"] == [{"type": "topic", "name": "t", "ops": [
        {"name": "retention.ms", "op": "set", "value": 5},
        {"name": "cleanup.policy", "op": "delete"}]}]
    with pytest.raises(KraftlogError) as caught:
        await admin.alter_configs("t", {"retention.ms": -5})
    assert caught.value.code == "INVALID_CONFIG"


async def test_calls_are_retried_while_no_controller_is_active_only():
    not_controller = KraftlogError("NOT_CONTROLLER", "electing")
    admin, broker = admin_with({
        "/v1/admin/topics/delete": [not_controller, {"topics": [{"name": "t", "error": None}]}],
        "/v1/admin/configs/describe": [KraftlogError("REQUEST_TIMED_OUT", "slow")]})
    assert await admin.delete_topics(["t"]) == {"t": None}
    assert len(broker.requests) == 2
    with pytest.raises(KraftlogError) as caught:
        await admin.describe_configs("t")
    assert caught.value.code == "REQUEST_TIMED_OUT" and len(broker.requests) == 3


async def test_describe_configs_and_elect_leaders_shapes():
    admin, _ = admin_with({
        "/v1/admin/configs/describe": {"resources": [{"type": "topic", "name": "t",
                                                      "error": None, "configs": [
            {"name": "retention.ms", "value": "5", "source": "TOPIC_CONFIG"}]}]},
        "/v1/admin/leaders/elect": {"partitions": [
            {"topic": "t", "partition": 0, "error": None},
            {"topic": "t", "partition": 1, "error": {"code": "ELECTION_NOT_NEEDED",
                                                     "message": "already"}}]}})
    assert await admin.describe_configs("t") == {
        "retention.ms": ConfigEntry("retention.ms", "5", "TOPIC_CONFIG")}
    elected = await admin.elect_leaders([("t", 0), TopicPartition("t", 1)])
    assert elected[TopicPartition("t", 0)] is None
    assert elected[TopicPartition("t", 1)].code == "ELECTION_NOT_NEEDED"


async def test_alter_partition_reassignments_sends_targets_and_cancels_and_raises_the_first_error():
    no_reassignment = {"code": "NO_REASSIGNMENT_IN_PROGRESS", "message": "nothing to cancel"}
    answer = {"partitions": [{"topic": "t", "partition": 0, "error": None},
                             {"topic": "t", "partition": 1, "error": no_reassignment}]}
    admin, broker = admin_with({"/v1/admin/partitions/reassign": [answer, answer]})
    with pytest.raises(KraftlogError) as caught:
        await admin.alter_partition_reassignments({("t", 0): [3, 1], TopicPartition("t", 1): None})
    assert caught.value.code == "NO_REASSIGNMENT_IN_PROGRESS"
    assert broker.requests[0] == ("/v1/admin/partitions/reassign", {"partitions": [
        {"topic": "t", "partition": 0, "replicas": [3, 1]},
        {"topic": "t", "partition": 1, "replicas": None}]})
    results = await admin.alter_partition_reassignments({("t", 0): [3, 1], ("t", 1): None},
                                                        raise_on_error=False)
    assert results[TopicPartition("t", 0)] is None
    assert results[TopicPartition("t", 1)].code == "NO_REASSIGNMENT_IN_PROGRESS"
    with pytest.raises(TypeError):
        await admin.alter_partition_reassignments({"t": [1]})


async def test_list_partition_reassignments_shapes():
    admin, broker = admin_with({"/v1/admin/partitions/reassignments": [
        {"partitions": [{"topic": "t", "partition": 2, "replicas": [3, 1], "adding_replicas": [3],
                         "removing_replicas": [1]}]},
        {"partitions": []}]})
    assert await admin.list_partition_reassignments() == {
        TopicPartition("t", 2): PartitionReassignment([3, 1], [3], [1])}
    assert await admin.list_partition_reassignments(["u"]) == {}
    assert [body for _, body in broker.requests] == [{"topics": None}, {"topics": ["u"]}]
