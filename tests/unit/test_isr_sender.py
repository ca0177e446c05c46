"""The broker's AlterPartition transport (api/broker/isr.py): the ISR changes
the replication core asks for in one pass of the event loop go to the
controller as one request, and each is answered on its own, the answers of
one request handed to the core together."""

import asyncio

from api.broker.isr import ALTER_BATCH_MAX, AlterPartitionSender
from api.broker.replication import SendAlterPartition
from kraft.client import ControllerError
from protocol.errors import StaleBrokerEpochError


class Answers:
    """Stands for the ReplicaManager: records what the sender hands back."""

    broker_id = 1

    def __init__(self) -> None:
        self.answered: dict[int, tuple] = {}
        self.calls = 0  # hand-overs: one per controller request

    def alter_partitions_answered(self, answers) -> None:
        self.calls += 1
        for request_id, answer, error_code in answers:
            assert request_id not in self.answered, f"request {request_id} answered twice"
            self.answered[request_id] = (answer, error_code)


class Controller:
    """Stands for the controller's client: answers each item of
    ``partitions/alter-many`` (an ISR of [] is refused), or fails the whole
    call with ``fail``."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.calls: list[tuple[str, dict]] = []
        self.fail = fail
        self.release = asyncio.Event()
        self.release.set()

    async def call(self, path, body, timeout_ms):
        self.calls.append((path, body))
        await self.release.wait()
        if self.fail is not None:
            raise self.fail
        return {"metadata_offset": 77, "partitions": [
            {"topic": item["topic"], "partition": item["partition"], "isr": item["new_isr"],
             "error": None} if item["new_isr"] else
            {"topic": item["topic"], "partition": item["partition"],
             "error": {"code": "INVALID_REQUEST", "message": "empty"}}
            for item in body["partitions"]]}


def action(request_id: int, partition: int, isr: list[int], broker_epoch: int = 5):
    return SendAlterPartition(request_id, {
        "broker_id": 1, "broker_epoch": broker_epoch, "topic": "t", "partition": partition,
        "leader_epoch": 0, "partition_epoch": 0, "new_isr": isr}, 1000)


async def settle(sender: AlterPartitionSender) -> None:
    for _ in range(5):
        await asyncio.sleep(0)
    await asyncio.gather(*sender._batches._tasks.values())


async def test_one_pass_of_isr_changes_is_one_request_and_each_is_answered():
    answers, controller = Answers(), Controller()
    sender = AlterPartitionSender(answers, controller)
    count = ALTER_BATCH_MAX + 2
    for i in range(count):
        sender.send(action(i, i, [1, 2] if i != 3 else []))
    await settle(sender)
    assert [len(body["partitions"]) for _, body in controller.calls] == [ALTER_BATCH_MAX, 2]
    path, body = controller.calls[0]
    assert path == "/v1/controller/partitions/alter-many"
    assert (body["broker_id"], body["broker_epoch"]) == (1, 5)
    assert "broker_epoch" not in body["partitions"][0]
    assert len(answers.answered) == count
    assert answers.calls == 2  # each request's answers handed to the core together
    assert answers.answered[0] == ({"topic": "t", "partition": 0, "isr": [1, 2], "error": None,
                                    "metadata_offset": 77}, None)
    assert answers.answered[3] == (None, "INVALID_REQUEST")


async def test_a_refused_request_refuses_every_item_and_a_cancelled_one_is_not_answered():
    answers = Answers()
    controller = Controller(fail=StaleBrokerEpochError("stale"))
    controller.release.clear()
    sender = AlterPartitionSender(answers, controller)
    sender.send(action(1, 0, [1]))
    sender.send(action(2, 1, [1]))
    sender.send(action(3, 2, [1], broker_epoch=6))  # another epoch: another request
    sender.send(action(4, 3, [1]))
    sender.cancel(4)  # never sent
    for _ in range(3):
        await asyncio.sleep(0)
    sender.cancel(2)  # sent: its answer is dropped
    controller.release.set()
    await settle(sender)
    assert sorted(len(body["partitions"]) for _, body in controller.calls) == [1, 2]
    assert answers.answered == {1: (None, "STALE_BROKER_EPOCH"),
                                3: (None, "STALE_BROKER_EPOCH")}


async def test_a_controller_without_the_batched_call_gets_the_changes_one_at_a_time():
    """A rolling upgrade: the controller answers NOT_FOUND for
    partitions/alter-many; the changes go one per partitions/alter."""

    class OlderController(Controller):
        async def call(self, path, body, timeout_ms):
            self.calls.append((path, body))
            if path.endswith("alter-many"):
                raise ControllerError("NOT_FOUND", "no endpoint")
            return {"topic": body["topic"], "partition": body["partition"],
                    "isr": body["new_isr"], "metadata_offset": 9}

    answers, controller = Answers(), OlderController()
    sender = AlterPartitionSender(answers, controller)
    sender.send(action(1, 0, [1, 2]))
    sender.send(action(2, 1, [1]))
    await settle(sender)
    await settle(sender)
    assert [path for path, _ in controller.calls] == [
        "/v1/controller/partitions/alter-many", "/v1/controller/partitions/alter",
        "/v1/controller/partitions/alter"]
    assert controller.calls[1][1]["broker_epoch"] == 5  # the whole single body
    assert answers.answered[1][0]["isr"] == [1, 2] and answers.answered[2][1] is None
    sender.send(action(3, 2, [1]))  # and the next ones too, for a while
    await settle(sender)
    assert controller.calls[-1][0] == "/v1/controller/partitions/alter"
