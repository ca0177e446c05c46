"""Kafka's binary protocol: the schemas generated from Kafka's message
definitions (``messages``, by tools/kafka_codegen.py), the codec that
reads and writes them (``codec``), and the conversion between Kafka's
record batches and kraftlog's (``records``). Used by the broker's Kafka
listener (api/broker/kafka_listener.py)."""
