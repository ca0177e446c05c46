"""Small builders shared by the tests."""

from __future__ import annotations

import contextlib

from storage.batch import HEADER_SIZE, BatchBuilder, decode_batches


#: The integration tests' socket.request.max.bytes (tests/integration/conftest.py).
REQUEST_BYTES_MAX = 64 * 1024

def make_batch(count: int = 3, *, value_bytes: int = 20, timestamp_ms: int = 1_000,
               tag: str = "r") -> bytes:
    """A batch of ``count`` records whose values name their position."""
    builder = BatchBuilder()
    for i in range(count):
        value = f"{tag}{i}".encode().ljust(value_bytes, b".")
        builder.append(f"k{i}".encode(), value, timestamp_ms=timestamp_ms)
    return builder.build()


def batch_and_section(recs) -> tuple[bytes, bytes]:
    """A batch of ``recs`` ((key, value, headers[, timestamp_ms]) each,
    timestamp 1000 by default) and its records section (after the header)."""
    builder = BatchBuilder()
    for key, value, headers, *timestamp in recs:
        builder.append(key, value, timestamp_ms=timestamp[0] if timestamp else 1000,
                       headers=headers)
    built = builder.build()
    return built, built[HEADER_SIZE:]


def read_all(log, start: int | None = None, upper: int | None = None) -> list:
    """Every record from ``start`` (default: log start) to the end, decoded,
    skipping records before ``start`` in the first batch as a consumer does."""
    start = log.log_start_offset if start is None else start
    records = []
    offset = start
    while offset < (log.log_end_offset if upper is None else upper):
        data = log.read(offset, 64 * 1024, upper_bound_offset=upper)
        if not data:
            break
        batch_records = [r for r in decode_batches(data) if r.offset >= offset]
        records.extend(batch_records)
        offset = batch_records[-1].offset + 1
    return records


@contextlib.asynccontextmanager
async def served(app, shutdown_timeout: float = 0.1):
    """``app`` (an aiohttp application) on an ephemeral loopback port for
    the test's duration; yields its base URL."""
    from aiohttp import web

    runner = web.AppRunner(app, shutdown_timeout=shutdown_timeout)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    finally:
        await runner.cleanup()
