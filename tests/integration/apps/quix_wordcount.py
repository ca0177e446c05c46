"""A quixstreams app, run by tests/integration/test_kafka_protocol.py as its
own process (quixstreams wants the main thread): read JSON words from
``IN``, keep a running count per word (state, backed by a changelog topic
quixstreams creates on kraftlog), write ``{"word", "count"}`` to ``OUT``,
exactly once (Kafka transactions), and stop after ``COUNT`` records.

    python -m tests.integration.apps.quix_wordcount BOOTSTRAP IN OUT GROUP STATE_DIR COUNT
"""

from __future__ import annotations

import sys

from quixstreams import Application


def main(bootstrap: str, source: str, sink: str, group: str, state_dir: str,
         count: int) -> None:
    app = Application(broker_address=bootstrap, consumer_group=group,
                      auto_offset_reset="earliest", state_dir=state_dir,
                      processing_guarantee="exactly-once", loglevel="WARNING")
    words = app.dataframe(app.topic(source, value_deserializer="json"))

    def counted(value: dict, state) -> dict:
        total = state.get(value["word"], 0) + 1
        state.set(value["word"], total)
        return {"word": value["word"], "count": total}
    words.apply(counted, stateful=True).to_topic(app.topic(sink, value_serializer="json"))
    app.run(count=count, timeout=60)


if __name__ == "__main__":
    main(*sys.argv[1:6], int(sys.argv[6]))
