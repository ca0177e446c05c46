"""``kraftlog node --config FILE``: run one node with its ``process.roles``.

A combined node (``broker,controller``, the single-node default) runs both in
one process and one event loop, the controller on its ``CONTROLLER``
listener and the broker on its ``BROKER`` listener. SIGTERM or SIGINT stops
the node gracefully: the broker first asks for a controlled shutdown (its
leaderships move to other brokers before it exits), then the controller
leaves the quorum. A second signal stops at once.
"""

from __future__ import annotations

import asyncio
import faulthandler
import logging
import os
import resource
import signal
import sys
from collections.abc import Callable

from kraft.client import ControllerClient
from kraft.config import NodeConfig
from protocol.gc_pauses import GcPauses
from protocol.malloc import keep_freed_memory

logger = logging.getLogger(__name__)

#: How long a stopping broker waits for its controlled shutdown.
CONTROLLED_SHUTDOWN_TIMEOUT_MS = 10_000


class Node:
    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.controller = None
        self.broker = None
        self.lifecycle = None
        self._reload_task: asyncio.Task | None = None
        self.client: ControllerClient | None = None
        #: Set by ``run_node``: the node cannot go on (the reason); it stops.
        self.on_fatal: Callable[[str], None] | None = None

    async def start(self) -> None:
        if self.config.is_controller:
            from kraft.server import ControllerServer
            self.controller = ControllerServer(self.config)
            await self.controller.start()
        if self.config.is_broker:
            from api.broker.lifecycle import BrokerLifecycle
            from api.broker.server import BrokerServer
            # One exchange may take a heartbeat interval: a controller that
            # does not answer in that time is skipped for the next one.
            self.client = ControllerClient(
                self.config.controller_urls,
                attempt_timeout_ms=max(100, self.config.heartbeat_interval_ms),
                ssl_context=self.config.tls.peer if self.config.tls else None)
            self.lifecycle = BrokerLifecycle(self.config, self.client)
            self.broker = BrokerServer(self.config, self.lifecycle, self.client)
            self.broker.on_fatal = self.on_fatal
            await self.broker.start()
            await self.lifecycle.start()
        if self.config.tls is not None:
            self._reload_task = asyncio.create_task(self._reload_certificates(),
                                                    name="certificate-reload")

    async def _reload_certificates(self) -> None:
        """Load a changed ssl.certfile / keyfile / cafile into the SSL
        listeners' context: new connections get it, without a restart."""
        tls = self.config.tls
        while True:
            await asyncio.sleep(tls.reload_interval_ms / 1000)
            # On the loop's thread, as every handshake with the context is:
            # OpenSSL does not promise a context changed under a handshake
            # on another thread is safe. A few stat() calls, a load when
            # something changed.
            try:
                tls.reloader.check()
            except Exception:  # noqa: BLE001  a bad reload must not end the checks
                logger.exception("reloading the TLS certificates failed; will try again")

    async def stop(self, controlled: bool = True) -> None:
        if self._reload_task is not None:
            self._reload_task.cancel()
            await asyncio.gather(self._reload_task, return_exceptions=True)
        if self.lifecycle is not None:
            if controlled:
                await self.lifecycle.controlled_shutdown(CONTROLLED_SHUTDOWN_TIMEOUT_MS)
            await self.lifecycle.stop()
        if self.broker is not None:
            await self.broker.stop()
        if self.client is not None:
            await self.client.close()
        if self.controller is not None:
            await self.controller.stop()


def raise_open_files_limit() -> int:
    """Raise this process's soft limit of open files to its hard limit (a
    broker holds a descriptor per segment of every partition, and a client
    connection each; many systems start processes at 1,024). Returns the
    limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (OSError, ValueError) as exc:
            logger.warning("cannot raise the open files limit from %d to %d: %s",
                           soft, hard, exc)
    return soft


async def run_node(config: NodeConfig) -> int:
    # `kill -USR1 <pid>` writes every thread's stack to the node's stderr:
    # how a node that hangs (say, in its shutdown) tells where.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    limit = raise_open_files_limit()
    logger.info("open files limit: %s", "unlimited" if limit == resource.RLIM_INFINITY
                else f"{limit:,}")
    keep_freed_memory()  # fetch and produce buffers reused, not faulted in afresh
    # Full garbage collections scan what changed, not every partition's state.
    gc_pauses = asyncio.get_running_loop().create_task(GcPauses().run())
    node = Node(config)
    stop = asyncio.Event()
    fatal: list[str] = []

    def on_fatal(reason: str) -> None:
        fatal.append(reason)
        stop.set()

    node.on_fatal = on_fatal
    loop = asyncio.get_running_loop()
    signals_seen = 0

    def on_signal() -> None:
        nonlocal signals_seen
        signals_seen += 1
        if signals_seen > 1:
            logger.warning("second signal: stopping now")
            raise SystemExit(1)
        logger.info("node %d stopping", config.node_id)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    await node.start()
    print(startup_banner(config), flush=True)
    await stop.wait()
    await node.stop(controlled=True)
    gc_pauses.cancel()
    if fatal:
        print(f"kraftlog node {config.node_id} stopped: {fatal[0]}", file=sys.stderr, flush=True)
        return 1
    print(f"kraftlog node {config.node_id} stopped", flush=True)
    return 0


def startup_banner(config: NodeConfig) -> str:
    """What a person starting a node needs: where it listens and, for a
    broker, three commands to try it."""
    from kraft.config import BROKER_LISTENER, CONTROLLER_LISTENER, KAFKA_LISTENER
    from protocol import DEFAULT_BOOTSTRAP

    roles = ",".join(sorted(config.roles))
    lines = [f"kraftlog node {config.node_id} ({roles}) started"]
    if config.is_broker:
        url = config.listeners[BROKER_LISTENER].url
        lines.append(f"  broker:     {url}")
        lines.append(f"  console:    {url}/ui/ (in a browser)")
    if config.is_controller:
        lines.append(f"  controller: {config.listeners[CONTROLLER_LISTENER].url}")
    if KAFKA_LISTENER in config.listeners:
        lines.append(f"  kafka:      {config.listeners[KAFKA_LISTENER]} "
                     "(Kafka clients: bootstrap.servers)")
    if config.is_broker:
        exe = sys.argv[0] if os.path.basename(sys.argv[0]) == "kraftlog" else "kraftlog"
        flag = "" if url == DEFAULT_BOOTSTRAP else f" --bootstrap {url}"
        lines += ["  quickstart (in another terminal):",
                  f"    {exe}{flag} topics create demo --partitions 3",
                  f"    echo 'hello kraftlog' | {exe}{flag} produce demo",
                  f"    {exe}{flag} consume demo --from-beginning --max-messages 1"]
    return "\n".join(lines)
