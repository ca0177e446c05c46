"""A broker that has not caught up with the metadata log refuses metadata.

Before a (re)started broker has replayed the controller's metadata log its
image is partial: answering ``/v1/metadata`` from it would tell clients that
existing topics do not exist (the Spark source would take them for deleted).
It answers 503 ``BROKER_NOT_AVAILABLE`` instead, which the client treats as
"ask another broker", and answers normally once caught up. A fenced broker
(cut off from the controller) refuses too: its picture may be stale. Real
processes: the broker is started while its controller is down, then the
controller is killed.
"""

from __future__ import annotations

from chaos.cluster import ProcessCluster, http_json, wait_until


def test_metadata_refused_until_caught_up(tmp_path):
    with ProcessCluster(str(tmp_path), controllers=1, brokers=1) as cluster:
        controller, broker = cluster.controller_ids[0], cluster.broker_ids[0]
        url = cluster.nodes[broker].broker_url + "/v1/metadata"
        cluster.start([broker])

        def answered():
            try:
                return http_json(url, timeout_s=2.0)
            except OSError:
                return None  # not listening yet
        status, body = wait_until(answered, 30, "the broker's HTTP listener")
        assert status == 503
        assert body["error"]["code"] == "BROKER_NOT_AVAILABLE"
        assert "metadata" in body["error"]["message"]

        cluster.start([controller])
        wait_until(lambda: (answered() or (None,))[0] == 200, 30,
                   "metadata answered once the broker caught up")

        # Cut off from the controller the broker fences itself; its picture
        # may be stale from then on, so it refuses again.
        cluster.kill(controller)
        status, body = wait_until(lambda: (r := answered()) and r[0] == 503 and r, 30,
                                  "metadata refused by the fenced broker")
        assert body["error"]["code"] == "BROKER_NOT_AVAILABLE"
        assert "stale" in body["error"]["message"]
