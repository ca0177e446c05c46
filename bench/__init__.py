"""The benchmark programs behind ``kraftlog bench ...``.

Each starts what it measures (a log on a scratch directory, a single node, a
cluster of real processes) and prints its figures next to a reference
measured in the same run (a raw disk write, Redis Streams, NATS JetStream,
Parquet). They may use every layer, since they measure every layer; nothing
of the product imports them, and the CLI loads them only for ``kraftlog
bench``. Figures and their commands go to BENCHMARKS.md.
"""
