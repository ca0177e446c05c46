"""chaos/netns.py for real: namespaces, a bridge, and cuts that drop packets.

These make real namespaces, so they need root. On a machine that cannot, the
same tests check that it says why and that ``setup`` refuses with
``NetworkError`` (they are not skipped: that behaviour is what the chaos
harness relies on there). Every wait is bounded and every process started is
killed in a ``finally``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from chaos.netns import (INTERFACE_NAME_MAX_CHARS, Network, NetworkError, bridge_name,
                         host_veth_name, namespace_name, process_is_alive, sweep_stale,
                         unavailable_reason)

ECHO_PORT = 9000
CONNECT_TIMEOUT_SECONDS = 1.0
SERVER_READY_SECONDS = 5.0
COMMAND_TIMEOUT_SECONDS = 10

ECHO_SERVER_CODE = """
import socket, sys, threading
def echo(connection):
    with connection:
        while data := connection.recv(1024):
            connection.sendall(data)
server = socket.create_server((sys.argv[1], int(sys.argv[2])))
while True:
    connection, _ = server.accept()
    threading.Thread(target=echo, args=(connection,), daemon=True).start()
"""

CONNECT_CODE = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])) as s:
        s.sendall(b"ping")
        print("echo" if s.recv(4) == b"ping" else "connected without echo")
except TimeoutError:
    print("timeout")
except ConnectionRefusedError:
    print("refused")
except OSError as error:
    print(f"error {error.errno}")
"""


# ---------------------------------------------------------------- helpers


def assert_unavailability_is_explained(reason: str) -> None:
    assert isinstance(reason, str) and len(reason.split()) >= 3, reason
    with pytest.raises(NetworkError):
        Network([1]).setup()


def connect(address: str, port: int = ECHO_PORT) -> str:
    """From the root namespace (the harness): "echo", "timeout", "refused"..."""
    try:
        with socket.create_connection((address, port), timeout=CONNECT_TIMEOUT_SECONDS) as s:
            s.sendall(b"ping")
            return "echo" if s.recv(4) == b"ping" else "connected without echo"
    except TimeoutError:
        return "timeout"
    except ConnectionRefusedError:
        return "refused"


def connect_from(network: Network, node_id: int, address: str, port: int = ECHO_PORT) -> str:
    """The same, from inside a node's namespace."""
    argv = network.wrap(node_id, [sys.executable, "-c", CONNECT_CODE, address, str(port),
                                  str(CONNECT_TIMEOUT_SECONDS)])
    completed = subprocess.run(argv, capture_output=True, text=True,
                               timeout=COMMAND_TIMEOUT_SECONDS, check=True)
    return completed.stdout.strip()


def start_echo_server(network: Network, node_id: int) -> subprocess.Popen:
    """An echo server inside the node's namespace, bound to the node's
    address; returned once the harness can reach it."""
    address = network.address(node_id)
    process = subprocess.Popen(
        network.wrap(node_id, [sys.executable, "-c", ECHO_SERVER_CODE, address, str(ECHO_PORT)]),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + SERVER_READY_SECONDS
    while connect(address) != "echo":
        if process.poll() is not None or time.monotonic() > deadline:
            stop(process)
            raise AssertionError(f"echo server on {address} not ready: "
                                 f"{process.stderr.read().decode()!r}")
        time.sleep(0.05)
    return process


@contextmanager
def harness_echo_server(address: str) -> Iterator[int]:
    """An echo server in this process (the root namespace); yields its port."""
    server = socket.create_server((address, 0))
    server.settimeout(0.1)
    stopping = threading.Event()

    def serve() -> None:
        while not stopping.is_set():
            try:
                connection, _ = server.accept()
            except TimeoutError:
                continue
            with connection:
                connection.settimeout(CONNECT_TIMEOUT_SECONDS)
                connection.sendall(connection.recv(4))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stopping.set()
        thread.join(timeout=COMMAND_TIMEOUT_SECONDS)
        server.close()


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
    process.wait(timeout=COMMAND_TIMEOUT_SECONDS)


def namespaces_and_links() -> str:
    """What ``ip netns list`` and ``ip -o link`` show, in one text."""
    return "\n".join(subprocess.run(argv, capture_output=True, text=True, check=True,
                                    timeout=COMMAND_TIMEOUT_SECONDS).stdout
                     for argv in (["ip", "netns", "list"], ["ip", "-o", "link"]))


def present_names(names: list[str]) -> list[str]:
    shown = namespaces_and_links()
    return [name for name in names if name in shown]


def dead_pid() -> int:
    """A pid no process has now (counting down from the kernel's limit)."""
    with open("/proc/sys/kernel/pid_max") as pid_max_file:
        pid = int(pid_max_file.read()) - 1
    while process_is_alive(pid):
        pid -= 1
    return pid


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def namespace_reason() -> str | None:
    return unavailable_reason()


@pytest.fixture
def network(namespace_reason):
    """A set-up network of nodes 1, 2, 3; or None, once it is checked that a
    machine without namespaces says why and refuses to set one up."""
    if namespace_reason is not None:
        assert_unavailability_is_explained(namespace_reason)
        yield None
        return
    made = Network([1, 2, 3])
    made.setup()
    try:
        yield made
    finally:
        made.teardown()


@pytest.fixture
def echo_on_node_2(network):
    if network is None:
        yield None
        return
    process = start_echo_server(network, 2)
    try:
        yield process
    finally:
        stop(process)


# ---------------------------------------------------------------- tests


def test_a_machine_that_cannot_says_why_and_setup_refuses(namespace_reason):
    if namespace_reason is not None:
        assert_unavailability_is_explained(namespace_reason)
        return
    # As root, see the refusal for real: the same checks in a forked child
    # that gives up root. (And the probe here left no namespace behind.)
    assert f"kraftlog-{os.getpid()}-" not in namespaces_and_links()
    reason, refusal = run_as_nobody(unprivileged_view).splitlines()
    assert reason == ("not root (uid 65534): network namespaces need CAP_NET_ADMIN "
                      "and CAP_SYS_ADMIN")
    assert refusal.startswith("refused: cannot set up network namespaces: not root")


def unprivileged_view() -> str:
    try:
        Network([1]).setup()
    except NetworkError as error:
        return f"{unavailable_reason()}\nrefused: {error}"
    return f"{unavailable_reason()}\nsetup did not refuse"


def run_as_nobody(function) -> str:
    """``function()`` in a forked child whose uid and gid are 65534; its text."""
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            os.write(write_end, function().encode())
        finally:
            os._exit(0)
    os.close(write_end)
    deadline = time.monotonic() + COMMAND_TIMEOUT_SECONDS
    try:
        with os.fdopen(read_end, "rb") as output:
            while os.waitpid(child, os.WNOHANG) == (0, 0):
                if time.monotonic() > deadline:
                    raise AssertionError("the unprivileged child did not finish")
                time.sleep(0.01)
            return output.read().decode()
    finally:
        if process_is_alive(child):
            os.kill(child, 9)
            os.waitpid(child, 0)


def test_names_fit_the_kernel_limit_for_the_largest_pid_and_node():
    largest_pid = 2 ** 22  # the kernel's largest pid_max
    assert len(bridge_name(largest_pid, 36 ** 3 - 1)) <= INTERFACE_NAME_MAX_CHARS
    assert len(host_veth_name(largest_pid, 36 ** 3 - 1, 244)) <= INTERFACE_NAME_MAX_CHARS
    with pytest.raises(NetworkError, match="longer than"):
        host_veth_name(largest_pid, 36 ** 3, 244)
    with pytest.raises(ValueError):
        Network([245])
    with pytest.raises(ValueError):
        Network([1, 1])


def test_nodes_and_the_harness_reach_a_server_in_a_namespace(network, echo_on_node_2):
    if network is None:
        return
    assert network.address(2).rsplit(".", 1)[1] == "12"
    assert network.host_address.rsplit(".", 1)[1] == "1"
    assert connect_from(network, 1, network.address(2)) == "echo"
    assert connect_from(network, 3, network.address(2)) == "echo"
    assert connect(network.address(2)) == "echo"
    with harness_echo_server(network.host_address) as port:  # nodes reach the harness
        assert connect_from(network, 1, network.host_address, port) == "echo"
    # wrap() keeps the pid: the harness signals the node's own process.
    print_pid = [sys.executable, "-c", "import os; print(os.getpid())"]
    process = subprocess.Popen(network.wrap(1, print_pid), stdout=subprocess.PIPE, text=True)
    try:
        assert int(process.communicate(timeout=COMMAND_TIMEOUT_SECONDS)[0]) == process.pid
    finally:
        stop(process)


def test_a_partition_drops_silently_and_heal_restores(network, echo_on_node_2):
    if network is None:
        return
    network.partition([{1}, {2, 3}])
    assert network.cut_pairs() == {frozenset({1, 2}), frozenset({1, 3})}
    assert connect_from(network, 1, network.address(2)) == "timeout"  # dropped, not refused
    assert connect_from(network, 3, network.address(2)) == "echo"
    assert connect(network.address(2)) == "echo"  # the harness always gets through
    assert connect(network.address(1), port=ECHO_PORT + 1) == "refused"  # and to node 1
    with harness_echo_server(network.host_address) as port:  # and node 1 to it
        assert connect_from(network, 1, network.host_address, port) == "echo"

    network.heal()
    assert network.cut_pairs() == set()
    assert connect_from(network, 1, network.address(2)) == "echo"


def test_a_new_partition_replaces_the_old_and_unnamed_nodes_reach_everyone(network,
                                                                        echo_on_node_2):
    if network is None:
        return
    network.partition([{1}, {2, 3}])
    network.partition([{1, 2}, {3}])
    assert network.cut_pairs() == {frozenset({1, 3}), frozenset({2, 3})}
    assert connect_from(network, 1, network.address(2)) == "echo"
    network.partition([{1}, {3}])  # node 2 named nowhere: reaches and is reached by all
    assert network.cut_pairs() == {frozenset({1, 3})}
    assert connect_from(network, 1, network.address(2)) == "echo"
    assert connect_from(network, 3, network.address(2)) == "echo"
    with pytest.raises(ValueError):
        network.partition([{1, 2}, {2}])


def test_isolate_adds_cuts_and_cut_pairs_lists_them(network, echo_on_node_2):
    if network is None:
        return
    network.isolate(2, {3})
    assert network.cut_pairs() == {frozenset({2, 3})}
    network.isolate(1, {1, 2})  # itself is ignored
    assert network.cut_pairs() == {frozenset({2, 3}), frozenset({1, 2})}
    assert connect_from(network, 1, network.address(2)) == "timeout"
    assert connect_from(network, 1, network.address(3), port=ECHO_PORT + 1) == "refused"
    network.heal()
    assert network.cut_pairs() == set()
    assert connect_from(network, 3, network.address(2)) == "echo"


def test_teardown_leaves_nothing_and_can_be_repeated(namespace_reason):
    if namespace_reason is not None:
        assert_unavailability_is_explained(namespace_reason)
        return
    network = Network([1, 2, 3])
    try:
        network.setup()
        network.partition([{1}, {2, 3}])
        assert present_names(network.names()) == network.names()
        host_address = network.host_address
    finally:
        network.teardown()
    assert present_names(network.names()) == []
    addresses = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True,
                               text=True, check=True, timeout=COMMAND_TIMEOUT_SECONDS).stdout
    assert f" {host_address}/" not in addresses
    network.teardown()  # already gone: no error
    assert network.cut_pairs() == set()
    with pytest.raises(NetworkError, match="not set up"):
        network.address(1)


def test_a_failed_setup_deletes_what_it_made(namespace_reason):
    if namespace_reason is not None:
        assert_unavailability_is_explained(namespace_reason)
        return
    network = Network([1, 2, 3])
    squatter = network.names()[3]  # node 3's host veth name, taken beforehand
    subprocess.run(["ip", "link", "add", squatter, "type", "bridge"], check=True,
                   timeout=COMMAND_TIMEOUT_SECONDS)
    try:
        with pytest.raises(NetworkError) as raised:
            network.setup()
        assert f"link add {squatter} type veth" in str(raised.value)
        assert "exists" in str(raised.value)  # the command's stderr
        assert present_names(network.names()) == []
    finally:
        subprocess.run(["ip", "link", "del", squatter], capture_output=True,
                       timeout=COMMAND_TIMEOUT_SECONDS)
        network.teardown()


def test_sweep_deletes_leftovers_of_a_dead_owner_only(network):
    if network is None:
        return
    pid = dead_pid()
    namespace = namespace_name(pid, 0, "node1")
    veth = host_veth_name(pid, 0, 1)
    bridge = bridge_name(pid, 0)
    try:
        for command in (["ip", "netns", "add", namespace],
                        ["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0",
                         "netns", namespace],
                        ["ip", "link", "add", bridge, "type", "bridge"]):
            subprocess.run(command, check=True, timeout=COMMAND_TIMEOUT_SECONDS)
        assert present_names([namespace, veth, bridge]) == [namespace, veth, bridge]

        deleted = sweep_stale()

        assert {namespace, veth, bridge} <= set(deleted)
        assert present_names([namespace, veth, bridge]) == []
        # This process is alive: its network is untouched.
        assert not set(network.names()) & set(deleted)
        assert present_names(network.names()) == network.names()
    finally:
        for command in (["ip", "link", "del", veth], ["ip", "netns", "del", namespace],
                        ["ip", "link", "del", bridge]):
            subprocess.run(command, capture_output=True, timeout=COMMAND_TIMEOUT_SECONDS)
