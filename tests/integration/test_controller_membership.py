"""Dynamic controller membership (KIP-853) with real ``kraftlog node``
processes and the CLI: three controllers and a broker; a fourth controller
joins and becomes a voter with every record; the active controller and then
a follower are removed; every controller restarts (the static voter list
still says 1, 2, 3) and the log's voter set and the metadata survive.
Every wait has a deadline (``wait_until``)."""

import signal
import subprocess
import sys

import pytest

from chaos.cluster import ProcessCluster, http_json, wait_until


def cli(*argv, timeout_s=90):
    return subprocess.run([sys.executable, "-m", "api.cli", *argv], capture_output=True,
                          text=True, timeout=timeout_s)


def create_topic(cluster, name):
    status, body = cluster.controller_call("/v1/controller/topics/create", {
        "topics": [{"name": name, "num_partitions": 1, "replication_factor": 1}]})
    assert status == 200 and body["topics"][0]["error"] is None, body


def topic_names(cluster, node_id):
    return {t["name"] for t in cluster.metadata(node_id)["topics"]}


def voter_ids(status):
    return {v["id"] for v in status["voters"]}


def views_agree(cluster, ids, voters):
    """Every controller in ``ids`` answers and names exactly ``voters``."""
    for node_id in ids:
        status = cluster.quorum(node_id)
        if status is None or voter_ids(status) != voters:
            return False
    return True


@pytest.fixture
def cluster(tmp_path):
    with ProcessCluster(str(tmp_path / "cluster"), controllers=3, brokers=1) as c:
        c.start()
        c.wait_for_active_controller(20)
        c.wait_for_brokers_running(timeout_s=20)
        yield c


def test_add_and_remove_controllers_on_a_live_cluster_and_restart_them_all(cluster):
    create_topic(cluster, "before")
    new = cluster.add_joining_controller(5)
    cluster.start([5])
    wait_until(lambda: cluster.quorum(5), 20, "the joining controller to serve /v1/quorum")
    status = cluster.quorum(5)
    assert status["voter"] is False and voter_ids(status) == {1, 2, 3}

    bootstrap = cluster.nodes[1].controller_url
    added = cli("quorum", "add-controller", "--bootstrap-controller", bootstrap,
                "--id", "5", "--address", f"127.0.0.1:{new.controller_port}")
    assert added.returncode == 0, added.stderr
    assert "controller 5 is a voter" in added.stdout
    wait_until(lambda: views_agree(cluster, [1, 2, 3, 5], {1, 2, 3, 5}), 15,
               "every controller to name voters 1, 2, 3, 5")
    assert cluster.quorum(5)["voter"] is True
    assert "before" in topic_names(cluster, 5)  # caught up before it voted
    create_topic(cluster, "after-add")
    wait_until(lambda: "after-add" in topic_names(cluster, 5), 10, "controller 5 to apply")

    # Refusals: clear codes, never a 500.
    again = cli("quorum", "add-controller", "--bootstrap-controller", bootstrap,
                "--id", "5", "--address", f"127.0.0.1:{new.controller_port}")
    assert again.returncode == 1 and "DUPLICATE_VOTER" in again.stderr
    unknown = cli("quorum", "remove-controller", "--bootstrap-controller", bootstrap,
                  "--id", "42")
    assert unknown.returncode == 1 and "VOTER_NOT_FOUND" in unknown.stderr
    status, body = cluster.controller_call("/v1/controller/quorum/add-voter",
                                           {"node_id": 6, "address": "nohost"})
    assert status == 400 and body["error"]["code"] == "INVALID_REQUEST"

    # Removing the active controller: it hands over, then is removed.
    active = active_before = cluster.wait_for_active_controller()
    removed = cli("quorum", "remove-controller", "--bootstrap-controller", bootstrap,
                  "--id", str(active))
    assert removed.returncode == 0, removed.stderr
    left = {1, 2, 3, 5} - {active}
    wait_until(lambda: views_agree(cluster, sorted(left | {active}), left), 15,
               f"every controller, {active} too, to name voters {sorted(left)}")
    assert cluster.quorum(active)["voter"] is False
    new_active = cluster.wait_for_active_controller(10, exclude=(active,))
    create_topic(cluster, "after-remove")

    # And a follower.
    follower = min(left - {new_active})
    removed = cli("quorum", "remove-controller", "--bootstrap-controller",
                  cluster.nodes[new_active].controller_url, "--id", str(follower))
    assert removed.returncode == 0, removed.stderr
    voters = left - {follower}
    wait_until(lambda: views_agree(cluster, sorted(voters), voters), 15,
               f"voters {sorted(voters)}")
    shown = cli("quorum", "status", "--controller", cluster.nodes[new_active].controller_url)
    assert shown.returncode == 0, shown.stderr
    rows = [line.split()[0] for line in shown.stdout.splitlines() if line[:1].isdigit()]
    assert set(map(int, rows)) == voters

    # Every controller killed and restarted with its old config.
    controllers = [1, 2, 3, 5]
    for node_id in controllers:
        cluster.kill(node_id, signal.SIGKILL)
    cluster.start(controllers)
    active = cluster.wait_for_active_controller(30)
    assert active in voters
    # The removed ones know they were removed (they stay observers); the
    # first one removed never heard of the second removal, and needs not.
    wait_until(lambda: views_agree(cluster, sorted(voters), voters) and all(
        (cluster.quorum(n) or {}).get("voter") is False for n in (active_before, follower)),
        20, "the log's voter set on every controller after the restart")
    for node_id in sorted(voters):
        wait_until(lambda n=node_id: {"before", "after-add", "after-remove"}
                   <= topic_names(cluster, n), 10, f"controller {node_id}'s metadata")
    create_topic(cluster, "after-restart")
    status, body = http_json(cluster.nodes[cluster.broker_ids[0]].broker_url + "/v1/quorum")
    assert status == 200 and voter_ids(body) == voters
