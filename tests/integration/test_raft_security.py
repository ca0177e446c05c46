"""The Raft port: no byte from an unauthenticated peer is ever unpickled.

pysyncobj frames each Raft message as a 4-byte length and a zlib-compressed
pickle, and unpickling runs whatever the pickle names. The payload here is a
pickle whose loading creates a file. Sent to a controller whose Raft port
has no secret (allowed only on loopback, with a warning), it does create
the file: the threat is real and the payload is well formed. Sent to a
controller with a shared secret (pysyncobj's password: every message is a
Fernet token, whose HMAC is checked before anything is decrypted, let alone
unpickled), or to a lone controller that made up its own, the connection is
dropped, no file appears, and the cluster goes on working.
"""

from __future__ import annotations

import os
import pickle
import socket
import struct
import time
import zlib

from api.client import Admin, NewTopic, Producer
from chaos.cluster import FAST_SETTINGS, ProcessCluster, wait_until


class _CreatesAFile:
    """Unpickling this calls ``open(path, "w")``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def raft_port(cluster: ProcessCluster, node_id: int) -> int:
    return cluster.nodes[node_id].controller_port + 1  # controller.quorum.raft.port.offset


def send_raft_message(port: int, obj) -> None:
    """Frame ``obj`` as pysyncobj does and send it as a new peer would;
    return once the controller has dealt with it: it closed the connection,
    or (a message it accepted) kept it open for 5 s."""
    data = zlib.compress(pickle.dumps(obj), 3)
    deadline = time.monotonic() + 15
    while True:
        try:
            conn = socket.create_connection(("127.0.0.1", port), timeout=5)
            break
        except OSError:
            assert time.monotonic() < deadline, f"nothing listens on the Raft port {port}"
            time.sleep(0.1)
    with conn:
        conn.sendall(struct.pack("i", len(data)) + data)
        try:
            while conn.recv(4096):
                pass
        except (socket.timeout, ConnectionResetError):
            pass


def test_an_unauthenticated_raft_port_runs_a_peers_pickle(tmp_path):
    """The control: without a secret (two loopback voters, none configured)
    the payload runs."""
    marker = tmp_path / "ran"
    with ProcessCluster(str(tmp_path / "open"), controllers=2, brokers=0,
                        settings=FAST_SETTINGS, raft_secret=False) as cluster:
        cluster.start([1])
        send_raft_message(raft_port(cluster, 1), _CreatesAFile(str(marker)))
        wait_until(marker.exists, 15, "the pickle to run on the unauthenticated port")
        assert "the Raft port is unauthenticated" in cluster.log_tail(1, 200)


def test_a_controller_with_a_secret_unpickles_nothing_from_a_stranger(tmp_path):
    marker = tmp_path / "ran"
    with ProcessCluster(str(tmp_path / "secret"), controllers=3, brokers=1,
                        settings=FAST_SETTINGS) as cluster:
        assert "controller.quorum.secret.file" in cluster.settings
        cluster.start()
        cluster.wait_for_brokers_running(timeout_s=30)
        for controller in cluster.controller_ids:
            send_raft_message(raft_port(cluster, controller), _CreatesAFile(str(marker)))
        assert not marker.exists()
        # The quorum is unharmed: a topic is created and written.
        url = cluster.nodes[cluster.broker_ids[0]].broker_url
        with Admin(url) as admin:
            admin.create_topics([NewTopic("after-the-attack", 1, 1)])
        with Producer(url) as producer:
            producer.send("after-the-attack", b"still here").result(timeout=30)
        assert not marker.exists()
        for node_id in cluster.nodes:
            assert cluster.nodes[node_id].running, cluster.log_tail(node_id)


def test_a_lone_controller_without_a_configured_secret_makes_up_its_own(tmp_path):
    marker = tmp_path / "ran"
    with ProcessCluster(str(tmp_path / "lone"), controllers=1, brokers=0, combined=True,
                        settings=FAST_SETTINGS, raft_secret=False) as cluster:
        cluster.start()
        cluster.wait_for_brokers_running(timeout_s=30)
        send_raft_message(raft_port(cluster, 1), _CreatesAFile(str(marker)))
        assert not marker.exists()
        assert cluster.nodes[1].running
        assert not os.path.exists(os.path.join(cluster.base_dir, "raft-secret"))
