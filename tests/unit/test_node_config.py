"""Node configs: identity, roles, listeners, voters, and the errors a
mistyped config gets."""

import pytest

from kraft.config import load_node_config, node_config_from_settings
from protocol.errors import InvalidConfigError

BASE = {
    "node.id": 1,
    "process.roles": "broker,controller",
    "controller.quorum.voters": "1@127.0.0.1:9093,2@127.0.0.1:9193",
    "listeners": "BROKER://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093",
    "log.dirs": "/tmp/kraftlog-test-a,/tmp/kraftlog-test-b",
}


def config(**changes):
    settings = dict(BASE)
    for key, value in changes.items():
        key = key.replace("_", ".")
        if value is None:
            settings.pop(key, None)
        else:
            settings[key] = value
    return node_config_from_settings(settings)


def test_a_combined_node_with_kafka_defaults():
    c = config()
    assert c.is_broker and c.is_controller
    assert c.voters[2].port == 9193 and c.listeners["BROKER"].port == 9092
    assert c.raft_endpoint(1).port == 9094 and c.raft_endpoint(2).port == 9194
    assert (c.session_timeout_ms, c.heartbeat_interval_ms) == (9000, 2000)
    assert c.metadata_log_dir == "/tmp/kraftlog-test-a/__cluster_metadata"
    assert c.controller_urls == {1: "http://127.0.0.1:9093", 2: "http://127.0.0.1:9193"}
    assert c.unsafe_ack_before_replication is False


def test_the_deliberately_broken_broker_is_only_ever_asked_for():
    assert config(**{"unsafe.ack.before.replication": True}).unsafe_ack_before_replication
    assert config(**{"unsafe.ack.before.replication": "true"}).unsafe_ack_before_replication


@pytest.mark.parametrize("changes, message", [
    ({"node.id": None}, "node.id must be set"),
    ({"node.id": -1}, r"node.id = -1 is outside \[0, "),
    ({"node.id": "one"}, "node.id must be an integer"),
    ({"process.roles": "broker,zookeeper"}, "process.roles"),
    ({"process.roles": ""}, "process.roles"),
    ({"controller.quorum.voters": "1@127.0.0.1"}, "not host:port"),
    ({"controller.quorum.voters": "x@127.0.0.1:9093"}, "not id@host:port"),
    ({"controller.quorum.voters": "1@127.0.0.1:9093,1@127.0.0.1:9193"}, "given twice"),
    ({"controller.quorum.voters": "2@127.0.0.1:9193"}, "not in controller.quorum.voters"),
    ({"listeners": "BROKER://127.0.0.1:9092,CONTROLLER://127.0.0.1:9999"},
     "must be this node's voter address"),
    ({"listeners": "CONTROLLER://127.0.0.1:9093"}, "BROKER://host:port listener"),
    ({"listeners": "BROKER:127.0.0.1:9092"}, "NAME://host:port"),
    ({"listeners": "BROKER://127.0.0.1:99999,CONTROLLER://127.0.0.1:9093"}, "not host:port"),
    ({"broker.heartbeat.interval.ms": 9000}, "below broker.session.timeout.ms"),
    ({"broker.session.timeout.ms": 0}, r"broker.session.timeout.ms = 0 is outside \[1, "),
    ({"controller.quorum.fetch.timeout.ms": 100}, "at least controller.quorum.election"),
    ({"unclean.leader.election.enable": "maybe"}, "true or false"),
    ({"unsafe.ack.before.replication": 1}, "true or false"),
    ({"log.dirs": None}, "metadata needs a directory"),
    ({"max.connections.per.ip.overrides": "10.0.0.5"}, "not '<address>:<count>'"),
    ({"max.connections.per.ip.overrides": "10.0.0.5:-1"}, "a count of 0 or more"),
    ({"max.connections.per.ip.overrides": "10.0.0.5:5,:7"}, "':7' is not"),
    ({"max.connections": -1}, r"max.connections = -1 is outside \[0, "),
    ({"controller.quorum.voters": "1@127.0.0.1:65535", "listeners":
      "BROKER://127.0.0.1:9092,CONTROLLER://127.0.0.1:65535"}, "above 65535"),
])
def test_bad_settings_are_refused_with_a_message_naming_the_key(changes, message):
    settings = dict(BASE)
    for key, value in changes.items():
        if value is None:
            settings.pop(key)
        else:
            settings[key] = value
    with pytest.raises(InvalidConfigError, match=message):
        node_config_from_settings(settings)


def test_a_broker_only_node_needs_no_controller_listener():
    c = config(**{"process_roles": "broker", "listeners": "BROKER://127.0.0.1:9092",
                  "node_id": 4})
    assert c.is_broker and not c.is_controller


def test_overrides_from_the_command_line_are_typed_like_toml(tmp_path):
    path = tmp_path / "node.toml"
    path.write_text('"node.id" = 1\n"process.roles" = "broker"\n'
                    '"controller.quorum.voters" = "1@127.0.0.1:9093"\n'
                    '"listeners" = "BROKER://127.0.0.1:9092"\n"log.dirs" = "/tmp/x"\n')
    c = load_node_config(str(path), ["node.id=7", "broker.rack=rack-a",
                                     "unclean.leader.election.enable=true"])
    assert (c.node_id, c.rack, c.unclean_leader_election_enable) == (7, "rack-a", True)
    with pytest.raises(InvalidConfigError, match="key=value"):
        load_node_config(str(path), ["node.id"])


def test_missing_and_malformed_files_say_so(tmp_path):
    with pytest.raises(InvalidConfigError, match="does not exist"):
        load_node_config(str(tmp_path / "nope.toml"))
    bad = tmp_path / "bad.toml"
    bad.write_text("node.id = = 1")
    with pytest.raises(InvalidConfigError, match="not valid TOML"):
        load_node_config(str(bad))


def test_a_deposed_leaders_lease_renewals_cannot_outlive_a_session():
    with pytest.raises(InvalidConfigError, match="below broker.session.timeout.ms"):
        config(**{"broker_session_timeout_ms": 3000, "controller_quorum_fetch_timeout_ms": 3000})


# -- the Raft port's secret ------------------------------------------------------------------
PUBLIC_VOTERS = {"controller.quorum.voters": "1@10.1.2.3:9093,2@10.1.2.4:9093",
                 "listeners": "BROKER://10.1.2.3:9092,CONTROLLER://10.1.2.3:9093"}


def test_a_raft_port_beyond_loopback_needs_a_secret_and_says_why():
    with pytest.raises(InvalidConfigError) as refused:
        config(**{k.replace(".", "_"): v for k, v in PUBLIC_VOTERS.items()})
    message = str(refused.value)
    assert "10.1.2.3:9094" in message and "controller.quorum.secret.file" in message
    assert "run code" in message


def test_a_secret_file_is_read_checked_and_never_shown(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("s3cret-shared-by-every-controller\n")
    c = node_config_from_settings({**BASE, **PUBLIC_VOTERS,
                                   "controller.quorum.secret.file": str(secret)})
    assert c.raft_secret == b"s3cret-shared-by-every-controller"
    assert "s3cret" not in repr(c) and "s3cret" not in str(c.settings)
    secret.write_text("short")
    with pytest.raises(InvalidConfigError, match="at least 16"):
        node_config_from_settings({**BASE, "controller.quorum.secret.file": str(secret)})
    with pytest.raises(InvalidConfigError, match="cannot be read"):
        node_config_from_settings({**BASE, "controller.quorum.secret.file":
                                   str(tmp_path / "missing")})


def test_loopback_voters_may_go_without_a_secret_and_brokers_never_need_one():
    assert config().raft_secret is None
    broker = node_config_from_settings({**BASE, **PUBLIC_VOTERS, "process.roles": "broker",
                                        "listeners": "BROKER://10.1.2.9:9092", "node.id": 9})
    assert broker.raft_secret is None


def test_per_address_connection_limits_parse_as_kafka_writes_them():
    from kraft.config import parse_connection_overrides
    assert parse_connection_overrides(" 10.0.0.5:500, [::1]:3 ,127.0.0.1:0,") == {
        "10.0.0.5": 500, "::1": 3, "127.0.0.1": 0}
    assert parse_connection_overrides("") == {}


def test_a_node_raises_its_open_files_limit_to_the_hard_limit():
    """A broker holds a descriptor per segment of every partition: a node
    started with a low soft limit (1,024 on many systems) takes the hard
    limit it is allowed."""
    import resource

    from api.node import raise_open_files_limit

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        limit = raise_open_files_limit()
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)
        assert limit == hard
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
