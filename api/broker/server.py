"""The broker's HTTP server: for now the inspection endpoints, answered from
the broker's own copy of the metadata image; the data plane (produce, fetch,
offsets) joins it with the data plane issue.

  GET /healthz           liveness and the broker's lifecycle state
  GET /v1/cluster        controller, brokers
  GET /v1/brokers        registered brokers with state
  GET /v1/topics         topics with partition counts
  GET /v1/topics/{topic} per partition: leader, leader epoch, replicas, ISR
  GET /v1/quorum         the active controller's /v1/quorum (proxied)
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp
from aiohttp import web

from api.broker.lifecycle import BrokerLifecycle
from kraft import wire
from kraft.client import ControllerClient
from kraft.config import BROKER_LISTENER, NodeConfig
from kraft.errors import UnknownTopicOrPartitionError

logger = logging.getLogger(__name__)

#: How long the quorum proxy waits for a controller.
QUORUM_PROXY_TIMEOUT_S = 5.0


class BrokerServer:
    def __init__(self, config: NodeConfig, lifecycle: BrokerLifecycle,
                 client: ControllerClient) -> None:
        self.config = config
        self.lifecycle = lifecycle
        self.client = client
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application(middlewares=[wire.error_middleware])
        app.router.add_get("/healthz", self.handle_health)
        app.router.add_get("/v1/cluster", self.handle_cluster)
        app.router.add_get("/v1/brokers", self.handle_brokers)
        app.router.add_get("/v1/topics", self.handle_topics)
        app.router.add_get("/v1/topics/{topic}", self.handle_topic)
        app.router.add_get("/v1/quorum", self.handle_quorum)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
        await self._runner.setup()
        endpoint = self.config.listeners[BROKER_LISTENER]
        await web.TCPSite(self._runner, endpoint.host, endpoint.port).start()
        logger.info("broker %d listening on %s", self.config.node_id, endpoint.url)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    # -- handlers ---------------------------------------------------------
    async def handle_health(self, request: web.Request) -> web.Response:
        lifecycle = self.lifecycle
        return wire.respond(request, {
            "status": "ok", "node_id": self.config.node_id, "role": "broker",
            "state": lifecycle.state.value, "broker_epoch": lifecycle.broker_epoch,
            "metadata_offset": lifecycle.image.offset})

    def _brokers(self) -> list[dict]:
        image = self.lifecycle.image
        return [{"id": b.broker_id, "epoch": b.broker_epoch, "endpoints": b.endpoints,
                 "rack": b.rack, "fenced": b.fenced,
                 "in_controlled_shutdown": b.in_controlled_shutdown,
                 "leaders": len(image.partitions_led_by(b.broker_id))}
                for _, b in sorted(image.brokers.items())]

    async def handle_cluster(self, request: web.Request) -> web.Response:
        image = self.lifecycle.image
        return wire.respond(request, {
            "cluster_id": self.config.settings.get("cluster.id"),
            "controller_id": self.client.leader_id,
            "controllers": {str(nid): url for nid, url in self.config.controller_urls.items()},
            "metadata_offset": image.offset,
            "brokers": self._brokers(),
        })

    async def handle_brokers(self, request: web.Request) -> web.Response:
        return wire.respond(request, {"brokers": self._brokers()})

    async def handle_topics(self, request: web.Request) -> web.Response:
        image = self.lifecycle.image
        topics = [{"name": t.name, "topic_id": t.topic_id, "partitions": len(t.partitions),
                   "replication_factor": len(t.partitions[0].replicas) if t.partitions else 0}
                  for _, t in sorted(image.topics.items())]
        return wire.respond(request, {"topics": topics})

    async def handle_topic(self, request: web.Request) -> web.Response:
        name = request.match_info["topic"]
        image = self.lifecycle.image
        topic = image.topics.get(name)
        if topic is None:
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        return wire.respond(request, {
            "name": name, "topic_id": topic.topic_id, "configs": image.topic_configs(name),
            "partitions": [{"partition": p, "leader": reg.leader,
                            "leader_epoch": reg.leader_epoch,
                            "partition_epoch": reg.partition_epoch,
                            "replicas": reg.replicas, "isr": reg.isr}
                           for p, reg in sorted(topic.partitions.items())]})

    async def handle_quorum(self, request: web.Request) -> web.Response:
        """Ask the controllers; answer with the leader's view (it alone knows
        every voter's match index), else any controller's."""
        answers = await asyncio.gather(*(self._quorum_of(nid) for nid in self.client.voter_urls))
        views = [a for a in answers if a is not None]
        if not views:
            return wire.respond(request, {"error": {
                "code": "NOT_CONTROLLER",
                "message": f"no controller answered (voters {self.client.voter_urls})"}}, 503)
        leaders = [v for v in views if v.get("state") == "leader"]
        return wire.respond(request, (leaders or views)[0])

    async def _quorum_of(self, node_id: int) -> dict | None:
        try:
            return await self.client.get_json(node_id, "/v1/quorum", QUORUM_PROXY_TIMEOUT_S)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, OSError):
            return None
