"""The pure parts of `kraftlog cluster` (chaos/local_cluster.py): layout,
ids, ports, paths, settings, cluster.json, configs and the table."""

from __future__ import annotations

import itertools
import os

import pytest

from chaos.local_cluster import (ClusterError, LocalCluster, NodeHealth, describe_state,
                                 status_table, parse_settings, plan_cluster, progress_text,
                                 quorum_text, resolve_layout, table_rows)
from kraft.config import load_node_config


def counting_ports(start: int = 20000):
    """A deterministic ``pick_port``: consecutive ports, two for a pair."""
    counter = itertools.count(start)

    def pick(pair: bool) -> int:
        port = next(counter)
        if pair:
            next(counter)
        return port
    return pick


def test_dedicated_layout_numbers_controllers_first_and_gives_each_its_ports(tmp_path):
    cluster = plan_cluster(str(tmp_path), 3, 2, False, {}, counting_ports())
    assert {i: n.roles for i, n in cluster.nodes.items()} == {
        1: ("controller",), 2: ("controller",), 3: ("controller",),
        4: ("broker",), 5: ("broker",)}
    assert [(n.broker_port, n.controller_port, n.kafka_port)
            for n in cluster.nodes.values()] == [
        (None, 20000, None), (None, 20002, None), (None, 20004, None), (20006, None, 20007),
        (20008, None, 20009)]
    assert cluster.broker_ids == [4, 5] and cluster.controller_ids == [1, 2, 3]
    assert cluster.bootstrap_url == "http://127.0.0.1:20006"
    assert cluster.kafka_bootstrap == "127.0.0.1:20007,127.0.0.1:20009"
    node = cluster.nodes[4]
    assert (node.config_path, node.log_path, node.data_dir) == (
        str(tmp_path / "node-4.toml"), str(tmp_path / "node-4.log"), str(tmp_path / "node-4"))


def test_combined_layout_gives_every_node_both_roles_and_listeners(tmp_path):
    cluster = plan_cluster(str(tmp_path), 3, 3, True, {}, counting_ports())
    assert list(cluster.nodes) == [1, 2, 3]
    assert all(n.roles == ("broker", "controller") for n in cluster.nodes.values())
    assert all(n.broker_url and n.controller_url for n in cluster.nodes.values())
    assert cluster.layout_text == "3 combined nodes (controller + broker)"


def test_real_free_ports_never_collide_and_leave_room_for_raft(tmp_path):
    cluster = plan_cluster(str(tmp_path), 3, 3, False, {})
    ports = [p for n in cluster.nodes.values()
             for p in (n.broker_port, n.controller_port, n.kafka_port) if p]
    ports += [n.controller_port + 1 for n in cluster.nodes.values() if n.controller_port]
    assert len(ports) == len(set(ports)) == 12


@pytest.mark.parametrize("flags, layout", [
    ((None, None, None), None),
    ((1, 2, None), (1, 2, False)),
    ((None, 5, None), (3, 5, False)),
    ((None, None, 3), (3, 3, True)),
])
def test_resolve_layout(flags, layout):
    assert resolve_layout(*flags) == layout


@pytest.mark.parametrize("flags, message", [
    ((1, None, 3), "give it alone"),
    ((0, 1, None), "--controllers must be at least 1"),
    ((1, 0, None), "--brokers must be at least 1"),
    ((None, None, 0), "--combined must be at least 1"),
    ((20, 20, None), "more than the 32"),
])
def test_resolve_layout_rejects(flags, message):
    with pytest.raises(ClusterError, match=message):
        resolve_layout(*flags)


def test_settings_are_read_as_toml_values_else_text():
    assert parse_settings(["a.ms=1500", "b=true", "c = \"x y\"", "d=plain", "e=1.5"]) == {
        "a.ms": 1500, "b": True, "c": "x y", "d": "plain", "e": 1.5}
    with pytest.raises(ClusterError, match="KEY=VALUE"):
        parse_settings(["nokey"])
    with pytest.raises(ClusterError, match="sets listeners per node"):
        parse_settings(["listeners=BROKER://h:1"])


def test_cluster_json_round_trips_and_configs_load_as_node_configs(tmp_path):
    settings = {"broker.session.timeout.ms": 1500, "broker.heartbeat.interval.ms": 250,
                "controller.quorum.fetch.timeout.ms": 1000}
    cluster = plan_cluster(str(tmp_path), 1, 2, False, settings, counting_ports())
    cluster.nodes[2].pid = 4321
    cluster.save()
    loaded = LocalCluster.load(str(tmp_path))
    assert loaded == cluster
    cluster.write_configs()
    controller = load_node_config(cluster.nodes[1].config_path)
    broker = load_node_config(cluster.nodes[3].config_path)
    assert controller.roles == {"controller"} and broker.roles == {"broker"}
    assert broker.voters[1].port == cluster.nodes[1].controller_port
    assert broker.listeners["BROKER"].port == cluster.nodes[3].broker_port
    assert broker.session_timeout_ms == 1500
    assert broker.metadata_log_dir == os.path.join(cluster.nodes[3].data_dir,
                                                   "__cluster_metadata")
    assert broker.default_replication_factor == 2  # sized to two brokers
    assert broker.settings["min.insync.replicas"] == 1


def test_load_reports_a_missing_or_damaged_file(tmp_path):
    with pytest.raises(ClusterError, match="has no cluster.json"):
        LocalCluster.load(str(tmp_path))
    (tmp_path / "cluster.json").write_text('{"format_version": 1}')
    with pytest.raises(ClusterError, match="is damaged"):
        LocalCluster.load(str(tmp_path))


def test_table_and_states(tmp_path):
    cluster = plan_cluster(str(tmp_path), 1, 2, False, {}, counting_ports(30000))
    healths = {1: NodeHealth(True, controller={"active": True}),
               2: NodeHealth(True, broker={"state": "running"}),
               3: NodeHealth(False)}
    pids = {1: 101, 2: 102}
    assert [describe_state(cluster.nodes[i], healths[i]) for i in (1, 2, 3)] == [
        "active", "running", "down"]
    assert status_table(table_rows(cluster, pids, healths)).splitlines() == [
        "ID  ROLES       PID  BROKER URL              CONTROLLER URL          STATE",
        "1   controller  101  -                       http://127.0.0.1:30000  active",
        "2   broker      102  http://127.0.0.1:30002  -                       running",
        "3   broker      -    http://127.0.0.1:30004  -                       down",
    ]
    assert progress_text(cluster, healths) == (
        "active controller: 1; brokers running: 1/2 (not yet: 3: no answer)")
    combined = plan_cluster(str(tmp_path), 1, 1, True, {}, counting_ports())
    assert describe_state(combined.nodes[1], NodeHealth(
        True, broker={"state": "fenced"}, controller={"active": False})) == "fenced, standby"


def test_quorum_text():
    assert "node 2 (term 4" in quorum_text({"leader_id": 2, "term": 4}, [2])
    assert "its process is down" in quorum_text({"leader_id": 2, "term": 4}, [1])
    assert "election under way" in quorum_text({"leader_id": None, "term": 4}, [1])
    assert "unknown" in quorum_text(None, [])
