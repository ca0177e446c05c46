"""Fixtures shared by the integration modules: one combined node (controller
+ broker, real processes on loopback) per module that asks for it."""

from __future__ import annotations

import pytest

from chaos.cluster import FAST_SETTINGS, ProcessCluster
from tests.helpers import REQUEST_BYTES_MAX


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """One combined node with a small ``socket.request.max.bytes``
    (``REQUEST_BYTES_MAX``) so request limits are cheap to test."""
    settings = {**FAST_SETTINGS, "socket.request.max.bytes": REQUEST_BYTES_MAX}
    with ProcessCluster(str(tmp_path_factory.mktemp("single")), controllers=1, brokers=0,
                        combined=True, settings=settings) as cluster:
        cluster.start()
        cluster.wait_for_brokers_running(timeout_s=20)
        yield cluster


@pytest.fixture
def url(single) -> str:
    """The single node's broker URL."""
    return single.nodes[1].broker_url
