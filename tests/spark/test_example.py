"""The example pipeline (`make spark-example`, spark_source.example) as users
run it: its own process, its own SparkSession, against the shared cluster.

Killed with SIGKILL in the middle of a micro-batch (the driver and its
executors, the whole process group), then run again from its checkpoint:
the output topic, read with read_committed, holds each closed (window, user)
count exactly once and exactly right, as does the Parquet output.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys

import pytest

from chaos.cluster import wait_until
from tests.spark.test_sink import committed
from tests.spark.test_source import read_log, unique

pytestmark = pytest.mark.slow

#: Bounds of the example's runs (a SparkSession starts in ~8 s here).
RUN_TIMEOUT_S = 240


def example(bootstrap: str, topic: str, work, *extra: str) -> list[str]:
    return [sys.executable, "-m", "spark_source.example", "--bootstrap", bootstrap,
            "--topic", topic, "--out-topic", topic + "-counts", "--out", str(work / "out"),
            "--checkpoint", str(work / "cp"), *extra]


def in_flight_batch(checkpoint: str) -> int | None:
    """A micro-batch the query has planned (offsets/N) but not committed
    (commits/N), if any, past the first two."""
    def numbers(sub: str) -> set[int]:
        try:
            return {int(n) for n in os.listdir(os.path.join(checkpoint, sub)) if n.isdigit()}
        except FileNotFoundError:
            return set()
    started = numbers("offsets") - numbers("commits")
    return next((n for n in sorted(started) if n >= 2), None)


def test_example_killed_mid_batch_and_restarted_counts_exactly_once(bootstrap, tmp_path):
    topic = unique("clicks")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    log = open(tmp_path / "first.log", "w")
    first = subprocess.Popen(
        example(bootstrap, topic, tmp_path, "--produce", "3000", "--minutes", "4", "--follow",
                "--trigger-seconds", "0.2", "--max-offsets-per-trigger", "150"),
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    killed_in = None
    try:
        def mid_batch() -> bool:
            nonlocal killed_in
            killed_in = in_flight_batch(str(tmp_path / "cp" / "kraftlog"))
            return killed_in is not None or first.poll() is not None
        wait_until(mid_batch, RUN_TIMEOUT_S, "the example to be in the middle of a batch",
                   interval_s=0.02)
        assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
        first.wait(30)
        log.close()
    second = subprocess.run(example(bootstrap, topic, tmp_path, "--produce", "0"),
                            capture_output=True, text=True, env=env, timeout=RUN_TIMEOUT_S)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "micro-batch" in second.stdout

    counts = collections.Counter()
    out: dict[tuple[int, str], int] = {}
    for record in committed(bootstrap, topic + "-counts", 3):
        row = json.loads(record.value)
        assert record.key.decode() == row["user"]
        counts[(row["window_start"], row["user"])] += 1
        out[(row["window_start"], row["user"])] = row["clicks"]
    assert out, "no count was written"
    assert max(counts.values()) == 1, f"counts written twice: {counts.most_common(3)}"
    closed_until = max(start for start, _ in out) + 60_000
    clicks = [(r.timestamp, json.loads(r.value)["user"]) for r in read_log(bootstrap, topic, 3)]
    assert len(clicks) == 3000
    expected = collections.Counter((ts - ts % 60_000, user) for ts, user in clicks
                                   if ts < closed_until)
    assert out == dict(expected), f"killed in batch {killed_in}"
    import pyarrow as pa
    from pyarrow import parquet
    # As spark.read.parquet does: only the files the sink committed (its
    # _spark_metadata log); a run killed mid-batch may leave others behind.
    table = parquet.read_table(committed_parquet_files(tmp_path / "out"))
    starts_ms = table.column("window_start").cast(pa.timestamp("ms")).cast(pa.int64())
    rows = list(zip(starts_ms.to_pylist(), table.column("user").to_pylist(),
                    table.column("clicks").to_pylist()))
    assert len(rows) == len(out)
    assert {(ms, user): n for ms, user, n in rows} == out


def committed_parquet_files(out) -> list[str]:
    """The files Spark's file sink committed to ``out``: each batch's entry
    in ``_spark_metadata`` is a version line, then one JSON line per file
    (``.compact`` entries fold in the earlier batches)."""
    from urllib.parse import unquote, urlparse

    metadata = out / "_spark_metadata"
    files: set[str] = set()
    entries = [p for p in metadata.iterdir() if not p.name.startswith(".")]  # not .crc
    for entry in sorted(entries, key=lambda p: int(p.name.split(".")[0])):
        for line in entry.read_text().splitlines()[1:]:
            status = json.loads(line)
            path = unquote(urlparse(status["path"]).path)
            if status.get("action", "add") == "add":
                files.add(path)
            else:
                files.discard(path)
    return sorted(files)
