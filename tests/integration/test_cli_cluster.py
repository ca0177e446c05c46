"""`kraftlog cluster up|down|status` as a user runs it: the real CLI in
subprocesses, real detached node processes on loopback.

Every node the tests start is SIGKILLed by the ``cluster_dirs`` fixture
even when a test fails, and every wait has a deadline."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from chaos.local_cluster import CLUSTER_FILE, LocalCluster, live_pids, node_config_of

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAST = ["--set", "broker.session.timeout.ms=1500", "--set", "broker.heartbeat.interval.ms=250",
        "--set", "controller.quorum.election.timeout.ms=300",
        "--set", "controller.quorum.fetch.timeout.ms=1000"]
CLI_TIMEOUT_S = 60


def kraftlog(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run the CLI; ``env``: variables set on top of a copy of this process's
    environment without any KRAFTLOG_* variable."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KRAFTLOG_")}
    return subprocess.run([sys.executable, "-m", "api.cli", *args], capture_output=True,
                          text=True, timeout=CLI_TIMEOUT_S, cwd=REPO_ROOT,
                          env={**clean, **(env or {})})


def recorded(cluster_dir) -> dict:
    with open(os.path.join(cluster_dir, CLUSTER_FILE)) as f:
        return json.load(f)


def pids_of(cluster_dir) -> dict[int, int]:
    return {node["id"]: node["pid"] for node in recorded(cluster_dir)["nodes"]}


def wait_gone(pid_by_config: dict[str, int], timeout_s: float) -> None:
    """Wait until no pid still runs its node config."""
    deadline = time.monotonic() + timeout_s
    while True:
        running = {c: p for c, p in pid_by_config.items()
                   if node_config_of(p) == os.path.realpath(c)}
        if not running:
            return
        assert time.monotonic() < deadline, f"still running after {timeout_s} s: {running}"
        time.sleep(0.05)


@pytest.fixture
def cluster_dirs(tmp_path):
    """Directories of clusters under test; their nodes are killed at the end."""
    dirs: list[str] = []
    yield dirs, tmp_path
    for cluster_dir in dirs:
        if not os.path.exists(os.path.join(cluster_dir, CLUSTER_FILE)):
            continue
        cluster = LocalCluster.load(cluster_dir)
        for pid in live_pids(cluster.nodes.values()).values():
            os.kill(pid, signal.SIGKILL)


def test_up_status_down_of_one_combined_node_with_production_settings(cluster_dirs):
    dirs, tmp_path = cluster_dirs
    cluster_dir = str(tmp_path / "one")
    dirs.append(cluster_dir)

    up = kraftlog("cluster", "up", "--dir", cluster_dir, "--combined", "1")
    assert up.returncode == 0, up.stdout + up.stderr
    state = recorded(cluster_dir)
    (node,) = state["nodes"]
    assert node["id"] == 1 and node["roles"] == ["broker", "controller"]
    assert node["config_path"] == os.path.join(cluster_dir, "node-1.toml")
    assert node["data_dir"] == os.path.join(cluster_dir, "node-1")
    assert state["bootstrap"] == node["broker_url"]
    assert f"export KRAFTLOG_BOOTSTRAP={node['broker_url']}" in up.stdout
    assert "running, active" in up.stdout
    # Kafka's protocol beside the HTTP API: the printed bootstrap serves kcat.
    assert state["kafka_bootstrap"] == node["kafka_address"]
    assert f"Kafka clients: bootstrap.servers={node['kafka_address']}" in up.stdout
    listed = subprocess.run(["kcat", "-b", node["kafka_address"], "-L", "-J", "-m", "10"],
                            capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0 and '"brokers":[{"id":1' in listed.stdout, listed.stderr
    # The node outlives the CLI and runs the recorded config.
    assert node_config_of(node["pid"]) == os.path.realpath(node["config_path"])
    assert os.path.isdir(os.path.join(node["data_dir"], "__cluster_metadata"))

    status = kraftlog("cluster", "status", "--dir", cluster_dir, "--json")
    assert status.returncode == 0, status.stderr
    live = json.loads(status.stdout)
    assert [n["state"] for n in live["nodes"]] == ["running, active"]
    assert live["quorum"]["leader_id"] == 1

    down = kraftlog("cluster", "down", "--dir", cluster_dir)
    assert down.returncode == 0, down.stderr
    wait_gone({node["config_path"]: node["pid"]}, 10)
    assert f"cluster up --dir {cluster_dir}" in down.stdout
    assert os.path.exists(os.path.join(cluster_dir, CLUSTER_FILE))  # data and record kept
    assert os.path.isdir(node["data_dir"])
    status = kraftlog("cluster", "status", "--dir", cluster_dir)
    assert status.returncode == 0 and "down" in status.stdout

    purge = kraftlog("cluster", "down", "--dir", cluster_dir, "--purge")
    assert purge.returncode == 0, purge.stderr
    assert not os.path.exists(cluster_dir)


def test_up_restarts_only_a_killed_node_on_its_ports_and_down_stops_all(cluster_dirs):
    dirs, tmp_path = cluster_dirs
    cluster_dir = str(tmp_path / "three")
    dirs.append(cluster_dir)

    up = kraftlog("cluster", "up", "--dir", cluster_dir, "--controllers", "1",
                  "--brokers", "2", *FAST)
    assert up.returncode == 0, up.stdout + up.stderr
    state = recorded(cluster_dir)
    assert state["layout"] == {"controllers": 1, "brokers": 2, "combined": False}
    assert state["settings"]["broker.session.timeout.ms"] == 1500
    nodes = {n["id"]: n for n in state["nodes"]}
    assert {i: n["roles"] for i, n in nodes.items()} == {
        1: ["controller"], 2: ["broker"], 3: ["broker"]}
    assert nodes[1]["broker_url"] is None and nodes[2]["controller_url"] is None
    assert state["bootstrap"] == nodes[2]["broker_url"]
    with open(nodes[2]["config_path"]) as f:
        assert '"broker.heartbeat.interval.ms" = 250' in f.read()

    status = kraftlog("cluster", "status", "--dir", cluster_dir)
    assert status.returncode == 0, status.stderr
    lines = {line.split()[0]: line for line in status.stdout.splitlines() if line[:1].isdigit()}
    assert lines["1"].endswith("active")
    assert lines["2"].endswith("running") and lines["3"].endswith("running")
    assert "Active controller: node 1" in status.stdout

    before = pids_of(cluster_dir)
    os.kill(before[3], signal.SIGKILL)
    wait_gone({nodes[3]["config_path"]: before[3]}, 5)
    again = kraftlog("cluster", "up", "--dir", cluster_dir)
    assert again.returncode == 0, again.stdout + again.stderr
    after = pids_of(cluster_dir)
    assert after[3] != before[3]
    assert {i: after[i] for i in (1, 2)} == {i: before[i] for i in (1, 2)}
    assert {n["id"]: (n["broker_url"], n["controller_url"])
            for n in recorded(cluster_dir)["nodes"]} == {
        i: (n["broker_url"], n["controller_url"]) for i, n in nodes.items()}
    assert "left alone" in again.stdout

    down = kraftlog("cluster", "down", "--dir", cluster_dir, "--timeout-s", "15")
    assert down.returncode == 0, down.stderr
    wait_gone({nodes[i]["config_path"]: pid for i, pid in after.items()}, 5)
    assert all(pid is None for pid in pids_of(cluster_dir).values())


def test_up_secure_makes_a_tls_cluster_the_cli_reaches_with_the_printed_variables(
        cluster_dirs):
    dirs, tmp_path = cluster_dirs
    cluster_dir = str(tmp_path / "secure")
    dirs.append(cluster_dir)

    up = kraftlog("cluster", "up", "--dir", cluster_dir, "--combined", "1", "--secure", *FAST)
    assert up.returncode == 0, up.stdout + up.stderr
    state = recorded(cluster_dir)
    assert state["secure"] is True
    (node,) = state["nodes"]
    assert node["broker_url"].startswith("https://127.0.0.1:")
    assert node["controller_url"].startswith("https://127.0.0.1:")
    assert f"export KRAFTLOG_BOOTSTRAP={node['broker_url']}" in up.stdout
    certs = os.path.join(cluster_dir, "certs")
    exports = (f"export KRAFTLOG_SECURITY_PROTOCOL=SSL KRAFTLOG_SSL_CAFILE={certs}/ca.pem "
               f"KRAFTLOG_SSL_CERTFILE={certs}/client.pem "
               f"KRAFTLOG_SSL_KEYFILE={certs}/client-key.pem")
    assert exports in up.stdout
    assert "running, active" in up.stdout  # up's probes got through TLS
    with open(node["config_path"]) as f:
        config = f.read()
    assert '"listener.security.protocol.map" = "BROKER:SSL,CONTROLLER:SSL,KAFKA:SSL"' in config
    # Kafka clients with the printed TLS settings (the client certificate).
    kafka_line = next(line for line in up.stdout.splitlines()
                      if line.startswith("Kafka clients:"))
    kafka_settings = dict(pair.split("=", 1) for pair in kafka_line.split()[2:])
    listed = subprocess.run(["kcat", "-L", "-J", "-m", "10", "-b",
                             kafka_settings.pop("bootstrap.servers"),
                             *(f"-X{key}={value}" for key, value in kafka_settings.items())],
                            capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0 and '"brokers":[{"id":1' in listed.stdout, listed.stderr
    assert '"ssl.client.auth" = "required"' in config
    assert f'"ssl.certfile" = "{certs}/node-1.pem"' in config

    # The CLI with exactly the printed variables; and without them, refused.
    env = {"KRAFTLOG_BOOTSTRAP": node["broker_url"]}
    env.update(pair.split("=", 1) for pair in exports.removeprefix("export ").split())
    created = kraftlog("topics", "create", "secured", "--partitions", "2", env=env)
    assert created.returncode == 0, created.stdout + created.stderr
    listed = kraftlog("topics", "list", env=env)
    assert listed.returncode == 0, listed.stderr
    assert any(line.split()[:2] == ["secured", "2"] for line in listed.stdout.splitlines()), \
        listed.stdout
    plain = kraftlog("topics", "list", env={"KRAFTLOG_BOOTSTRAP": node["broker_url"]})
    assert plain.returncode != 0 and "secured" not in plain.stdout
    assert "certificate" in plain.stderr.lower(), plain.stderr

    # A second `up` without --secure keeps it TLS (nothing to start, its
    # probes over TLS), and so does `status`.
    again = kraftlog("cluster", "up", "--dir", cluster_dir)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "TLS with client certificates" in again.stdout and "left alone" in again.stdout
    assert exports in again.stdout
    status = kraftlog("cluster", "status", "--dir", cluster_dir, "--json")
    assert status.returncode == 0, status.stderr
    live = json.loads(status.stdout)
    assert live["secure"] is True and [n["state"] for n in live["nodes"]] == ["running, active"]
    assert live["quorum"]["leader_id"] == 1

    # Stopped and started again: the same CA and certificates, so the CLI's
    # variables still work.
    with open(os.path.join(certs, "ca.pem"), "rb") as f:
        ca = f.read()
    down = kraftlog("cluster", "down", "--dir", cluster_dir)
    assert down.returncode == 0, down.stderr
    wait_gone({node["config_path"]: node["pid"]}, 10)
    restarted = kraftlog("cluster", "up", "--dir", cluster_dir)
    assert restarted.returncode == 0, restarted.stdout + restarted.stderr
    assert "running, active" in restarted.stdout and exports in restarted.stdout
    with open(os.path.join(certs, "ca.pem"), "rb") as f:
        assert f.read() == ca
    listed = kraftlog("topics", "list", env=env)
    assert listed.returncode == 0 and "secured" in listed.stdout, listed.stderr

    pid = pids_of(cluster_dir)[1]
    down = kraftlog("cluster", "down", "--dir", cluster_dir)
    assert down.returncode == 0, down.stderr
    wait_gone({node["config_path"]: pid}, 10)


def test_up_secure_on_a_plaintext_cluster_is_refused_with_what_to_do(tmp_path):
    cluster_dir = tmp_path / "plain"
    cluster_dir.mkdir()
    (cluster_dir / CLUSTER_FILE).write_text(json.dumps({
        "format_version": 1, "layout": {"controllers": 1, "brokers": 1, "combined": True},
        "settings": {}, "nodes": [
            {"id": 1, "roles": ["broker", "controller"], "broker_url": "http://127.0.0.1:1",
             "controller_url": "http://127.0.0.1:2", "pid": None,
             "config_path": str(cluster_dir / "node-1.toml"),
             "log_path": str(cluster_dir / "node-1.log"), "data_dir": str(cluster_dir / "n1")},
        ]}))
    result = kraftlog("cluster", "up", "--dir", str(cluster_dir), "--secure")
    assert result.returncode == 1
    assert "made without --secure" in result.stderr and "use a new --dir" in result.stderr


def test_down_without_cluster_json_fails_with_one_clear_line(tmp_path):
    result = kraftlog("cluster", "down", "--dir", str(tmp_path / "nothing"))
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1
    assert "has no cluster.json" in result.stderr and "cluster up --dir" in result.stderr


def test_up_refuses_to_reshape_an_existing_cluster(tmp_path):
    cluster_dir = tmp_path / "made"
    cluster_dir.mkdir()
    (cluster_dir / CLUSTER_FILE).write_text(json.dumps({
        "format_version": 1, "layout": {"controllers": 1, "brokers": 1, "combined": False},
        "settings": {}, "nodes": [
            {"id": 1, "roles": ["controller"], "broker_url": None,
             "controller_url": "http://127.0.0.1:1", "pid": None,
             "config_path": str(cluster_dir / "node-1.toml"),
             "log_path": str(cluster_dir / "node-1.log"), "data_dir": str(cluster_dir / "n1")},
            {"id": 2, "roles": ["broker"], "broker_url": "http://127.0.0.1:3",
             "controller_url": None, "pid": None,
             "config_path": str(cluster_dir / "node-2.toml"),
             "log_path": str(cluster_dir / "node-2.log"), "data_dir": str(cluster_dir / "n2")},
        ]}))
    result = kraftlog("cluster", "up", "--dir", str(cluster_dir), "--combined", "3")
    assert result.returncode == 1
    assert "holds a cluster of 1 controller + 1 broker" in result.stderr
