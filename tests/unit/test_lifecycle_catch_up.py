"""BrokerLifecycle's metadata_caught_up: true only once the broker's image
holds what the controller had when it answered and the broker's own
registration; false again while a reload replays."""

from __future__ import annotations

from api.broker.lifecycle import BrokerLifecycle
from kraft.config import node_config_from_settings
from kraft.records import RegisterBrokerRecord, TopicRecord


def lifecycle(tmp_path) -> BrokerLifecycle:
    config = node_config_from_settings({
        "node.id": 1, "process.roles": "broker",
        "controller.quorum.voters": "9@127.0.0.1:1", "listeners": "BROKER://127.0.0.1:2",
        "log.dirs": str(tmp_path)})
    return BrokerLifecycle(config, client=None)  # the client is never called here


def records(first: int, count: int) -> list:
    return [[first + i, TopicRecord(f"t{first + i}", f"id-{first + i}").encode()]
            for i in range(count)]


def test_caught_up_needs_the_controllers_offset_and_the_registration(tmp_path):
    broker = lifecycle(tmp_path)
    broker.broker_epoch = 5
    register = [[0, RegisterBrokerRecord(1, "inc", {"BROKER": "127.0.0.1:2"}, None).encode()]]
    broker._apply({"offset": 9, "records": register + records(1, 3)})
    assert broker.image.offset == 3 and not broker.metadata_caught_up  # a 4 MiB chunk
    broker._apply({"offset": 9, "records": records(4, 3)})
    assert broker.image.offset == 6 and not broker.metadata_caught_up
    broker._apply({"offset": 9, "records": records(7, 3)})
    assert broker.metadata_caught_up
    broker.broker_epoch = 12  # re-registered at a later offset
    broker._apply({"offset": 10, "records": records(10, 1)})
    assert not broker.metadata_caught_up


def test_a_caught_up_broker_lets_changes_gather_before_it_polls_again(tmp_path, monkeypatch):
    """Behind the controller, the broker asks again at once; an answer that
    brings it up to the controller's offset is followed by a short pause
    (METADATA_POLL_PAUSE_S), so that while topics are created by the hundred
    each poll brings several batches; an empty answer (a long-poll that timed
    out) is asked again at once."""
    import asyncio

    from api.broker import lifecycle as lifecycle_module

    broker = lifecycle(tmp_path)
    answers = [{"offset": 6, "records": records(0, 3)},  # behind: again at once
               {"offset": 6, "records": records(3, 4)},  # caught up: a pause
               {"offset": 6, "records": []},  # nothing new: again at once
               {"offset": 8, "records": records(7, 2)}]  # caught up: a pause
    events = []

    class Client:
        async def call(self, path, body, **kwargs):
            events.append(("poll", body["after_offset"]))
            if not answers:
                broker._stopping = True
                return {"offset": broker.image.offset, "records": []}
            return answers.pop(0)

    real_sleep = asyncio.sleep

    async def sleep(seconds):
        events.append(("pause", seconds))
        await real_sleep(0)
    broker.client = Client()
    monkeypatch.setattr(lifecycle_module.asyncio, "sleep", sleep)
    asyncio.run(asyncio.wait_for(broker._metadata_loop(), 10))
    pause = ("pause", lifecycle_module.METADATA_POLL_PAUSE_S)
    assert events == [("poll", -1), ("poll", 2), pause, ("poll", 6), ("poll", 6), pause,
                      ("poll", 8)]
