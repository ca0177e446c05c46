"""One SparkSession (local[2,2]) for every Spark test, and one kraftlog cluster
(1 controller, 3 brokers: real processes on loopback) for the module.

A SparkSession takes seconds to start, so it is shared by the whole test
session; each test uses its own topics, query names and checkpoints.
"""

from __future__ import annotations

import pytest

from chaos.cluster import FAST_SETTINGS, ProcessCluster

SETTINGS = {**FAST_SETTINGS, "log.retention.check.interval.ms": 200,
            "log.cleaner.backoff.ms": 200}


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    import spark_source

    warehouse = tmp_path_factory.mktemp("spark-warehouse")
    # local[2,2]: two cores, and a failed task is tried once more (the
    # sink's task-retry test needs a retry; Spark's local default is none).
    session = spark_source.local_session("kraftlog-tests", master="local[2,2]", config={
        "spark.sql.warehouse.dir": str(warehouse),
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.session.timeZone": "UTC",
    })
    yield session
    session.stop()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    with ProcessCluster(str(tmp_path_factory.mktemp("spark-cluster")), controllers=1,
                        brokers=3, settings=SETTINGS, kafka=True) as cluster:
        cluster.start()
        cluster.wait_for_brokers_running(timeout_s=30)
        yield cluster


@pytest.fixture(scope="session")
def bootstrap(cluster) -> str:
    return ",".join(cluster.nodes[b].broker_url for b in cluster.broker_ids)
