"""Deterministic simulators that drive the product's pure cores with a seeded
random source (see ``tests/sim/replication.py``)."""
