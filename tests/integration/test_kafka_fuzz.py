"""A seeded fuzz campaign against a live broker's KAFKA listener: what any
Kafka client, or anything that connects to the port, can send.

Each request is built from Kafka's own message definitions (the codec the
listener decodes with): every API and version the listener speaks, every
field given a value drawn for its name and type (topics that exist and
ones that do not or cannot, partitions and offsets at and past every
edge, record batches valid, corrupted or garbage, short timeouts, nulls,
empty and long lists), and a fifth of the frames then have bytes flipped,
cut or added. Each goes on its own connection.

What users depend on, checked per request: a decodable request is
answered (its correlation id, a response that decodes) within a deadline,
never with UNKNOWN_SERVER_ERROR anywhere in it, and its connection is not
dropped (acks=0 produces and SASL messages on a PLAINTEXT listener may
close it, as in Kafka); a malformed one is answered or closed, never left
hanging. After the run: the broker is up, its log holds no traceback (a
handler's exception is logged with one before its connection is closed),
and a new topic takes acks=all writes and serves them back.

``KRAFTLOG_KAFKA_FUZZ_SECONDS`` (default 20) and ``KRAFTLOG_KAFKA_FUZZ_SEED``
make a longer campaign of the same test.
"""

from __future__ import annotations

import os
import random
import socket
import struct
import time
from typing import Any

from api.broker.kafka_listener import SASL_APIS, SUPPORTED
from api.client import Admin, Consumer, NewTopic, Producer, TopicPartition
from chaos.cluster import FAST_SETTINGS, ProcessCluster, wait_until
from protocol.kafka import codec, messages
from protocol.kafka.records import native_to_kafka
from storage.batch import build_batch

SECONDS = float(os.environ.get("KRAFTLOG_KAFKA_FUZZ_SECONDS", "20"))
SEED = int(os.environ.get("KRAFTLOG_KAFKA_FUZZ_SEED", "0"))
ANSWER_DEADLINE_S = 20.0  # every wait a request may ask for here is far shorter
QUIET_WAIT_S = 0.5  # for an answer that may rightly never come
TOPIC = "fuzz"
PRODUCE, FETCH = 0, 1
UNKNOWN_SERVER_ERROR = messages.ERRORS["UNKNOWN_SERVER_ERROR"]
SPOKEN = sorted((api_key, version) for api_key, (low, high) in SUPPORTED.items()
                for version in range(low, high + 1))

NAMES = [TOPIC, TOPIC, "fuzz-new", "__consumer_offsets", "", ".", "..", "a" * 300, "bad/name",
         "ünï", "fuzz-group", "fuzz-txn"]
EDGE_INTS = [0, 1, -1, -2, 2, 3, 7, 2**15 - 1, 2**31 - 1, -2**31]
EDGE_LONGS = [0, 1, -1, -2, -3, 5, 100, 2**62, 2**63 - 1, -2**63]


def _batch(rng: random.Random) -> bytes:
    """A Kafka record batch: valid, or with a byte flipped or cut, or garbage."""
    valid = native_to_kafka(build_batch(
        [(rng.choice([None, b"k"]), b"v" * rng.randrange(0, 64))
         for _ in range(rng.randrange(1, 5))]))
    how = rng.random()
    if how < 0.6:
        return valid
    data = bytearray(valid)
    if how < 0.8:
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif how < 0.9:
        data = data[:rng.randrange(len(data))]
    else:
        data = bytearray(rng.randbytes(rng.randrange(0, 80)))
    return bytes(data)


def _int(rng: random.Random, name: str, kind: str) -> int | float:
    lowered = name.lower()
    if kind == "float64":
        return rng.choice([0.0, 1.5, -1.0, 1e308])
    if "timeout" in lowered or "waitms" in lowered or "delay" in lowered:
        return rng.choice([0, 1, 50, 500, -1])  # never a long wait
    if lowered == "acks":
        return rng.choice([-1, 1, 0, 2, -2])
    if "bytes" in lowered:
        return rng.choice([0, 1, 1024, 1 << 20, -1, 2**31 - 1])
    if kind == "int64":
        return rng.choice(EDGE_LONGS)
    if kind == "int8":
        return rng.choice([0, 1, -1, 2, 127, -128])
    if kind == "int16":
        return rng.choice([0, 1, -1, 2, 3, 32767, -32768])
    if kind in ("uint16", "uint32"):
        return rng.choice([0, 1, 65535 if kind == "uint16" else 2**32 - 1])
    return rng.choice(EDGE_INTS)


def _value(rng: random.Random, field: codec.Field, kind: str, depth: int) -> Any:
    if field.nullable and rng.random() < 0.1:
        return None
    if kind in codec._FIXED:
        return _int(rng, field.name, kind)
    if kind == "string":
        return rng.choice(NAMES) if rng.random() < 0.9 else rng.randbytes(8).hex()
    if kind == "records":
        return _batch(rng)
    if kind == "bytes":
        return rng.randbytes(rng.choice([0, 1, 8, 64]))
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "uuid":
        return rng.choice([codec.ZERO_UUID, rng.randbytes(16)])
    return _struct(rng, field.sub, depth + 1)


def _struct(rng: random.Random, plan: codec.Plan, depth: int = 0) -> dict:
    values: dict[str, Any] = {}
    for field in plan.fields + plan.tagged:
        if field in plan.tagged and rng.random() < 0.7:
            continue  # left at its default
        if field.kind.startswith("[]"):
            if field.nullable and rng.random() < 0.1:
                values[field.name] = None
                continue
            count = rng.choice([0, 1, 1, 2, 3] if depth < 3 else [0, 1])
            if rng.random() < 0.02:
                count = 300  # a long list
            values[field.name] = [_value(rng, field, field.element, depth)
                                  for _ in range(count)]
        else:
            values[field.name] = _value(rng, field, field.kind, depth)
    return values


def _frame(rng: random.Random, api_key: int, version: int, correlation_id: int
           ) -> tuple[bytes, dict]:
    header = codec.encode(messages.RequestHeader,
                          codec.request_header_version(api_key, version), {
                              "RequestApiKey": api_key, "RequestApiVersion": version,
                              "CorrelationId": correlation_id,
                              "ClientId": rng.choice(["fuzz", None, ""])})
    body = _struct(rng, codec.plan(messages.APIS[api_key][0], version))
    return bytes(header + codec.encode(messages.APIS[api_key][0], version, body)), body


def _mutate(rng: random.Random, frame: bytes) -> bytes:
    data = bytearray(frame)
    for _ in range(rng.randrange(1, 4)):
        how = rng.random()
        if how < 0.5 and len(data) > 8:  # past the api key and version
            at = rng.randrange(8, len(data))
            data[at] = rng.choice([0x00, 0xFF, 0x7F, 0x80, data[at] ^ 0x01])
        elif how < 0.75 and len(data) > 10:
            data = data[:rng.randrange(10, len(data))]
        else:
            data += rng.randbytes(rng.randrange(1, 16))
    return bytes(data)


def _read_exactly(sock: socket.socket, size: int, deadline: float) -> bytes | None:
    """``size`` bytes, or None if the connection closed first; raises
    TimeoutError at ``deadline``."""
    out = bytearray()
    while len(out) < size:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = sock.recv(size - len(out))
        except (ConnectionResetError, BrokenPipeError):
            return None
        if not chunk:
            return None
        out += chunk
    return bytes(out)


def _exchange(address: tuple[str, int], frame: bytes, wait_s: float) -> bytes | None:
    """Send one frame on a new connection: the answer (without its size),
    or None if the broker closed the connection without one; TimeoutError
    if neither happened within ``wait_s``."""
    deadline = time.monotonic() + wait_s
    with socket.create_connection(address, timeout=wait_s) as sock:
        try:
            sock.sendall(struct.pack(">i", len(frame)) + frame)
        except (ConnectionResetError, BrokenPipeError):
            return None
        size = _read_exactly(sock, 4, deadline)
        if size is None:
            return None
        return _read_exactly(sock, struct.unpack(">i", size)[0], deadline)


def _error_codes(value: Any, path: str = "") -> list[tuple[str, int]]:
    found = []
    if isinstance(value, dict):
        for key, inner in value.items():
            if key == "ErrorCode" and isinstance(inner, int):
                found.append((path + key, inner))
            else:
                found += _error_codes(inner, f"{path}{key}.")
    elif isinstance(value, list):
        for item in value:
            found += _error_codes(item, path)
    return found


def _judge(api_key: int, version: int, correlation_id: int, body: dict | None,
           answer: bytes | None) -> str | None:
    """What is wrong with the outcome of one request (None: nothing).
    ``body`` None: the frame was mutated."""
    where = f"API {api_key} v{version}"
    if answer is None:
        acks_zero = api_key == PRODUCE and body is not None and body.get("Acks") == 0
        if body is None or acks_zero or api_key in SASL_APIS:
            return None
        return f"{where}: a decodable request's connection was closed unanswered"
    try:
        header, pos = codec.decode(messages.ResponseHeader,
                                   codec.response_header_version(api_key, version), answer)
        response, _ = codec.decode(messages.APIS[api_key][1], version, answer, pos)
    except codec.KafkaDecodeError as exc:
        return f"{where}: an answer that does not decode: {exc}"
    if header["CorrelationId"] != correlation_id:
        return f"{where}: correlation id {header['CorrelationId']}, not {correlation_id}"
    unknown = [path for path, code in _error_codes(response) if code == UNKNOWN_SERVER_ERROR]
    if unknown:
        return f"{where}: UNKNOWN_SERVER_ERROR at {unknown[:3]}"
    return None


def test_a_kafka_listener_fuzz_campaign_finds_nothing_and_leaves_the_broker_whole(tmp_path):
    with ProcessCluster(str(tmp_path / "cluster"), controllers=1, brokers=1,
                        settings=FAST_SETTINGS, kafka=True) as cluster:
        cluster.start()
        cluster.wait_for_brokers_running(timeout_s=60)
        broker = cluster.nodes[cluster.broker_ids[0]]
        with Admin([broker.broker_url]) as admin:
            admin.create_topics([NewTopic(TOPIC, 3, 1)])
        address = (broker.host, broker.kafka_port)
        rng = random.Random(SEED)
        findings: list[str] = []
        outcomes = {"answered": 0, "closed": 0, "unanswered acks=0": 0}
        reached: set[int] = set()
        deadline = time.monotonic() + SECONDS
        correlation_id = 0
        while time.monotonic() < deadline and len(findings) < 20:
            api_key, version = rng.choice(SPOKEN)
            correlation_id += 1
            frame, body = _frame(rng, api_key, version, correlation_id)
            if rng.random() < 0.2:
                frame, body = _mutate(rng, frame), None
            # An acks=0 produce is not answered, as in Kafka (and a mutated
            # produce may have become one).
            quiet = api_key == PRODUCE and (body is None or body.get("Acks") == 0)
            try:
                answer = _exchange(address, frame, QUIET_WAIT_S if quiet else ANSWER_DEADLINE_S)
            except TimeoutError:
                if quiet:
                    outcomes["unanswered acks=0"] += 1
                    continue
                findings.append(f"API {api_key} v{version}: no answer within "
                                f"{ANSWER_DEADLINE_S:.0f} s to {frame[:400].hex()}")
                continue
            outcomes["closed" if answer is None else "answered"] += 1
            if answer is not None:
                reached.add(api_key)
            finding = _judge(api_key, version, correlation_id, body, answer)
            if finding is not None:
                findings.append(finding)
        assert not findings, findings
        requests = sum(outcomes.values())
        print(f"kafka listener fuzz: seed {SEED}, {SECONDS:.0f} s: {requests} requests "
              f"{outcomes}, {len(reached)} APIs answered, no findings")
        assert requests >= 200 and reached == set(SUPPORTED) - SASL_APIS, (outcomes, reached)

        assert broker.running
        with open(broker.log_path, errors="replace") as f:
            log = f.read()
        assert "Traceback" not in log, log[log.index("Traceback") - 2000:][:6000]
        with Admin([broker.broker_url]) as admin:  # the broker still serves
            admin.create_topics([NewTopic("after-fuzz", 1, 1)])
        with Producer([broker.broker_url], acks="all") as producer:
            for i in range(10):
                producer.send("after-fuzz", f"v{i}".encode(), partition=0)
            producer.flush(30_000)
        got: list[bytes] = []
        with Consumer([broker.broker_url], auto_offset_reset="earliest",
                      consumer_timeout_ms=5000) as consumer:
            consumer.assign([TopicPartition("after-fuzz", 0)])
            wait_until(lambda: got.extend(r.value for r in consumer) or len(got) >= 10, 30,
                       "the records written after the fuzz run")
        assert got == [f"v{i}".encode() for i in range(10)]
