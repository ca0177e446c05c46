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
