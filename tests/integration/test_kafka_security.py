"""The KAFKA listener on a secure cluster: TLS, SASL and ACLs, with real
Kafka clients. One controller and three brokers (real processes) whose
BROKER and KAFKA listeners are SASL_SSL, ACLs on.

- confluent-kafka (librdkafka) logs in with SCRAM-SHA-512, kafka-python with
  SCRAM-SHA-256, kcat with PLAIN: each writes and reads what it may, byte
  for byte, as the same users do over HTTP.
- A wrong password, an unknown user and an unknown mechanism are refused
  (SASL_AUTHENTICATION_FAILED, the connection closed); a request sent
  before authenticating closes the connection.
- ACLs apply as Kafka applies them: a topic the user may not DESCRIBE is
  missing from its metadata, one it may not WRITE refuses its records
  (TOPIC_AUTHORIZATION_FAILED), a group it may not READ refuses it
  (GROUP_AUTHORIZATION_FAILED), an admin request names what it refused.
"""

from __future__ import annotations

import socket
import ssl
import struct
import subprocess
import time

import pytest

from api.client import AclBinding, Admin, Consumer, NewTopic, TopicPartition
from chaos.cluster import FAST_SETTINGS, ProcessCluster
from protocol import acl

WRITER, READER, PLAIN_USER = "kafka-writer", "kafka-reader", "kafka-plain"
PASSWORD = "s3cret-kafka-pass"
TOPIC, SECRET_TOPIC, GROUP = "kafka-sec", "kafka-sec-hidden", "kafka-sec-readers"
RECORDS = 200


def grants(user: str, *entries: tuple[str, str, str]) -> list[AclBinding]:
    return [AclBinding(rtype, name, acl.LITERAL, f"User:{user}", acl.WILDCARD, operation,
                       acl.ALLOW) for rtype, name, operation in entries]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with ProcessCluster(str(tmp_path_factory.mktemp("kafka-sec")), controllers=1, brokers=3,
                        settings=dict(FAST_SETTINGS), tls=True, acls=True, sasl=True,
                        kafka=True) as running:
        running.start()
        running.wait_for_active_controller(30)
        running.wait_for_brokers_running(timeout_s=30)
        with Admin([running.nodes[b].broker_url for b in running.broker_ids],
                   **running.client_security) as admin:
            admin.create_topics([NewTopic(TOPIC, 3, 3), NewTopic(SECRET_TOPIC, 1, 3)])
        running.add_user(WRITER, PASSWORD, grants(
            WRITER, (acl.TOPIC, TOPIC, acl.WRITE), (acl.TOPIC, TOPIC, acl.DESCRIBE)))
        running.add_user(READER, PASSWORD, grants(
            READER, (acl.TOPIC, TOPIC, acl.READ), (acl.GROUP, GROUP, acl.READ)))
        running.add_user(PLAIN_USER, PASSWORD, grants(
            PLAIN_USER, (acl.TOPIC, TOPIC, acl.DESCRIBE), (acl.TOPIC, TOPIC, acl.READ)))
        # kafka-python logs in with SCRAM-SHA-256: the reader's credential.
        with Admin([running.nodes[b].broker_url for b in running.broker_ids],
                   **running.client_security) as admin:
            admin.upsert_user(READER, PASSWORD, mechanism="SCRAM-SHA-256")
        yield running


def confluent_config(cluster: ProcessCluster, user: str, mechanism: str = "SCRAM-SHA-512",
                     password: str = PASSWORD, **extra) -> dict:
    return {"bootstrap.servers": cluster.kafka_bootstrap, "security.protocol": "SASL_SSL",
            "sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": password,
            "ssl.ca.location": cluster.certs["ca"].certfile, **extra}


def kafka_python_config(cluster: ProcessCluster, user: str,
                        mechanism: str = "SCRAM-SHA-256") -> dict:
    return {"bootstrap_servers": cluster.kafka_bootstrap.split(","),
            "security_protocol": "SASL_SSL", "sasl_mechanism": mechanism,
            "sasl_plain_username": user, "sasl_plain_password": PASSWORD,
            "ssl_cafile": cluster.certs["ca"].certfile}


def record(i: int) -> tuple[bytes, bytes]:
    return b"k-%d" % i, b"secure value %d " % i + bytes([i % 256]) * (i % 20)


def test_scram_users_write_and_read_byte_for_byte_within_their_acls(cluster):
    from confluent_kafka import KafkaError, Producer
    from kafka import KafkaConsumer

    producer = Producer(confluent_config(cluster, WRITER, **{"enable.idempotence": True}))
    failures: list = []
    for i in range(RECORDS):
        key, value = record(i)
        producer.produce(TOPIC, value, key, partition=i % 3,
                         on_delivery=lambda err, _msg: err and failures.append(err))
    assert producer.flush(30) == 0
    assert failures == []
    # A topic the writer may not WRITE (nor see): each record refused.
    refused: list = []
    producer.produce(SECRET_TOPIC, b"nope", partition=0,
                     on_delivery=lambda err, _msg: refused.append(err))
    producer.flush(30)
    assert [e.code() for e in refused] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]

    consumer = KafkaConsumer(TOPIC, group_id=GROUP, auto_offset_reset="earliest",
                             enable_auto_commit=False, consumer_timeout_ms=20_000,
                             **kafka_python_config(cluster, READER))
    try:
        got: dict[int, list] = {}
        deadline = time.monotonic() + 60
        while sum(map(len, got.values())) < RECORDS and time.monotonic() < deadline:
            for tp, messages in consumer.poll(timeout_ms=1000).items():
                got.setdefault(tp.partition, []).extend(
                    (m.offset, m.key, m.value) for m in messages)
        consumer.commit()
    finally:
        consumer.close()
    for partition in range(3):
        wanted = [record(i) for i in range(RECORDS) if i % 3 == partition]
        assert got[partition] == [(n, k, v) for n, (k, v) in enumerate(wanted)]
    # The commit is the group's, as kraftlog's admin client sees it.
    with Admin([cluster.nodes[b].broker_url for b in cluster.broker_ids],
               **cluster.client_security) as admin:
        committed = admin.list_consumer_group_offsets(GROUP)
    assert {tp: committed[tp].offset for tp in committed} == {
        TopicPartition(TOPIC, p): len(got[p]) for p in range(3)}

    # The same records over HTTP, read as the same user with its password.
    with Consumer([cluster.nodes[b].broker_url for b in cluster.broker_ids],
                  auto_offset_reset="earliest", consumer_timeout_ms=5000,
                  **cluster.user_security(READER, PASSWORD)) as http:
        http.assign([TopicPartition(TOPIC, 0)])
        seen = []
        deadline = time.monotonic() + 30
        while len(seen) < len(got[0]) and time.monotonic() < deadline:
            seen.extend((r.offset, r.key, r.value) for r in http.poll(1000))
    assert seen == got[0]


def test_metadata_shows_only_what_a_user_may_describe(cluster):
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(confluent_config(cluster, WRITER))
    topics = admin.list_topics(timeout=20).topics
    assert TOPIC in topics and SECRET_TOPIC not in topics
    named = admin.list_topics(SECRET_TOPIC, timeout=20).topics[SECRET_TOPIC]
    assert named.error is not None and named.error.code() == 29  # TOPIC_AUTHORIZATION_FAILED


def test_a_group_the_user_may_not_read_is_refused(cluster):
    from confluent_kafka import Consumer as KafkaConsumer
    from confluent_kafka import KafkaError, KafkaException

    consumer = KafkaConsumer(confluent_config(cluster, READER, "SCRAM-SHA-256", **{
        "group.id": "not-the-readers", "auto.offset.reset": "earliest"}))
    try:
        consumer.subscribe([TOPIC])
        deadline = time.monotonic() + 30
        error = None
        while error is None and time.monotonic() < deadline:
            try:
                message = consumer.poll(1.0)
            except KafkaException as exc:
                error = exc.args[0]
                break
            if message is not None and message.error() is not None:
                error = message.error()
        assert error is not None and error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED
    finally:
        consumer.close()


def test_admin_requests_are_authorized_per_topic(cluster):
    from confluent_kafka.admin import AdminClient, NewTopic as KafkaNewTopic

    admin = AdminClient(confluent_config(cluster, WRITER))
    futures = admin.create_topics([KafkaNewTopic("kafka-sec-new", 1, 1)])
    with pytest.raises(Exception) as refused:
        futures["kafka-sec-new"].result(30)
    assert refused.value.args[0].code() == 29  # TOPIC_AUTHORIZATION_FAILED
    futures = admin.delete_topics([TOPIC])
    with pytest.raises(Exception) as refused:
        futures[TOPIC].result(30)
    assert refused.value.args[0].code() == 29
    assert TOPIC in admin.list_topics(timeout=20).topics


def test_kcat_logs_in_with_plain(cluster):
    common = ["kcat", "-b", cluster.kafka_bootstrap, "-X", "security.protocol=SASL_SSL",
              "-X", "sasl.mechanisms=PLAIN", "-X", f"sasl.username={PLAIN_USER}",
              "-X", f"sasl.password={PASSWORD}",
              "-X", f"ssl.ca.location={cluster.certs['ca'].certfile}"]
    listed = subprocess.run([*common, "-L", "-J"], capture_output=True, text=True,
                            timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert f'"topic":"{TOPIC}"' in listed.stdout and SECRET_TOPIC not in listed.stdout
    consumed = subprocess.run([*common, "-C", "-t", TOPIC, "-p", "1", "-o", "beginning",
                               "-c", "5", "-f", "%k=%s\\n", "-e"],
                              capture_output=True, timeout=60)
    assert consumed.returncode == 0, consumed.stderr
    wanted = [record(i) for i in range(RECORDS) if i % 3 == 1][:5]
    assert consumed.stdout == b"".join(k + b"=" + v + b"\n" for k, v in wanted)
    wrong = subprocess.run([c.replace(f"sasl.password={PASSWORD}", "sasl.password=wrong")
                            for c in common] + ["-L", "-m", "3"],
                           capture_output=True, text=True, timeout=60)
    assert wrong.returncode != 0
    assert "Authentication failed" in wrong.stderr or "SASL" in wrong.stderr


def _frame(api_key: int, version: int, body: bytes, correlation_id: int = 7) -> bytes:
    client = b"raw-test"
    header = struct.pack(">hhih", api_key, version, correlation_id, len(client)) + client
    return struct.pack(">i", len(header) + len(body)) + header + body


def _tls_socket(cluster: ProcessCluster) -> ssl.SSLSocket:
    host, port = cluster.kafka_bootstrap.split(",")[0].rsplit(":", 1)
    context = ssl.create_default_context(cafile=cluster.certs["ca"].certfile)
    raw = socket.create_connection((host, int(port)), timeout=10)
    return context.wrap_socket(raw, server_hostname=host)


def _answer(sock: ssl.SSLSocket) -> bytes:
    size = b""
    while len(size) < 4:
        chunk = sock.recv(4 - len(size))
        if not chunk:
            return b""
        size += chunk
    (length,) = struct.unpack(">i", size)
    data = b""
    while len(data) < length:
        chunk = sock.recv(length - len(data))
        if not chunk:
            break
        data += chunk
    return data


def test_requests_before_authentication_close_the_connection(cluster):
    # Metadata v1 (all topics) before any SASL: the connection is closed.
    with _tls_socket(cluster) as sock:
        sock.sendall(_frame(3, 1, struct.pack(">i", -1)))
        assert _answer(sock) == b""
    # ApiVersions is answered, and lists the SASL APIs.
    with _tls_socket(cluster) as sock:
        sock.sendall(_frame(18, 0, b""))
        answer = _answer(sock)
        (count,) = struct.unpack_from(">i", answer, 6)
        keys = {struct.unpack_from(">h", answer, 10 + 6 * i)[0] for i in range(count)}
        assert {17, 36, 3, 0, 1} <= keys


def _plain_login(cluster: ProcessCluster, user: str, password: str
                 ) -> tuple[int, bytes, bytes]:
    """SaslHandshake v1 (PLAIN), then SaslAuthenticate v0: its error code
    and message, and what follows on the connection (b"": closed)."""
    with _tls_socket(cluster) as sock:
        sock.sendall(_frame(17, 1, struct.pack(">h", 5) + b"PLAIN"))
        assert struct.unpack_from(">h", _answer(sock), 4)[0] == 0
        token = b"\0" + user.encode() + b"\0" + password.encode()
        sock.sendall(_frame(36, 0, struct.pack(">i", len(token)) + token))
        answer = _answer(sock)
        code = struct.unpack_from(">h", answer, 4)[0]
        # After a refusal the connection is closed; after a login, a
        # Metadata request is answered.
        sock.sendall(_frame(3, 1, struct.pack(">i", 0)))
        return code, answer, _answer(sock)


def test_wrong_passwords_unknown_users_and_mechanisms_are_refused(cluster):
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient

    code, _answer_bytes, after = _plain_login(cluster, PLAIN_USER, PASSWORD)
    assert code == 0 and after != b""
    for user, password in ((PLAIN_USER, "wrong"), ("nobody-at-all", PASSWORD)):
        code, answer, after = _plain_login(cluster, user, password)
        assert code == 58 and after == b""  # SASL_AUTHENTICATION_FAILED, then closed
        assert b"wrong user name or password" in answer
    # librdkafka's SCRAM with a wrong password: an authentication error.
    errors: list = []
    admin = AdminClient(confluent_config(cluster, WRITER, password="wrong",
                                         error_cb=errors.append))
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=5)
    deadline = time.monotonic() + 10
    while not errors and time.monotonic() < deadline:
        admin.poll(0.5)  # serves error_cb
    assert KafkaError._AUTHENTICATION in {e.code() for e in errors}
    assert "wrong user name or password" in " ".join(e.str() for e in errors)
    # A mechanism the listener does not offer: UNSUPPORTED_SASL_MECHANISM (33).
    with _tls_socket(cluster) as sock:
        mechanism = b"GSSAPI"
        sock.sendall(_frame(17, 1, struct.pack(">h", len(mechanism)) + mechanism))
        answer = _answer(sock)
        assert struct.unpack_from(">h", answer, 4)[0] == 33
        assert b"SCRAM-SHA-512" in answer and b"PLAIN" in answer
        assert _answer(sock) == b""  # and closed


def test_an_ssl_kafka_listener_names_clients_by_their_certificates(tmp_path):
    # KAFKA:SSL, client certificates required: the administrator's
    # certificate (a super user) writes and reads; a client without one is
    # disconnected before its first request is answered.
    from confluent_kafka import Consumer as KafkaConsumer
    from confluent_kafka import KafkaException, Producer
    from confluent_kafka.admin import AdminClient

    with ProcessCluster(str(tmp_path), controllers=1, brokers=1, tls=True, acls=True,
                        kafka=True, settings={**FAST_SETTINGS,
                                              "ssl.client.auth": "required"}) as running:
        running.start()
        running.wait_for_active_controller(30)
        running.wait_for_brokers_running(timeout_s=30)
        with Admin([running.nodes[b].broker_url for b in running.broker_ids],
                   **running.client_security) as admin:
            admin.create_topics([NewTopic("mtls", 1, 1)])
        tls_config = {"bootstrap.servers": running.kafka_bootstrap,
                      "security.protocol": "SSL",
                      "ssl.ca.location": running.certs["ca"].certfile}
        with_cert = {**tls_config,
                     "ssl.certificate.location": running.certs["client"].certfile,
                     "ssl.key.location": running.certs["client"].keyfile}
        producer = Producer(with_cert)
        for i in range(10):
            producer.produce("mtls", b"m-%d" % i, partition=0)
        assert producer.flush(30) == 0
        consumer = KafkaConsumer({**with_cert, "group.id": "mtls-g",
                                  "auto.offset.reset": "earliest"})
        try:
            consumer.subscribe(["mtls"])
            got = []
            deadline = time.monotonic() + 30
            while len(got) < 10 and time.monotonic() < deadline:
                message = consumer.poll(1.0)
                if message is not None and message.error() is None:
                    got.append(message.value())
            assert got == [b"m-%d" % i for i in range(10)]
        finally:
            consumer.close()
        with pytest.raises(KafkaException):
            AdminClient(tls_config).list_topics(timeout=3)
        broker = running.nodes[running.broker_ids[0]]
        with open(broker.log_path, encoding="utf-8") as log:
            assert "has no client certificate, which this listener requires" in log.read()



class _Session:
    """A raw Kafka connection logged in with PLAIN, speaking requests as
    dicts through kraftlog's generated schemas (what is checked is what
    the broker answers)."""

    def __init__(self, cluster: ProcessCluster, user: str, node: int | None = None) -> None:
        host, port = cluster.kafka_bootstrap.split(",")[node or 0].rsplit(":", 1)
        context = ssl.create_default_context(cafile=cluster.certs["ca"].certfile)
        self.sock = context.wrap_socket(socket.create_connection((host, int(port)), timeout=10),
                                        server_hostname=host)
        self.correlation = 0
        assert self.call(17, 1, {"Mechanism": "PLAIN"})["ErrorCode"] == 0
        token = b"\0" + user.encode() + b"\0" + PASSWORD.encode()
        assert self.call(36, 0, {"AuthBytes": token})["ErrorCode"] == 0

    def call(self, api_key: int, version: int, body: dict) -> dict:
        from protocol.kafka import codec, messages
        self.correlation += 1
        out = bytearray()
        codec.encode(messages.RequestHeader, codec.request_header_version(api_key, version),
                     {"RequestApiKey": api_key, "RequestApiVersion": version,
                      "CorrelationId": self.correlation, "ClientId": "raw-test"}, out)
        codec.encode(messages.APIS[api_key][0], version, body, out)
        self.sock.sendall(struct.pack(">i", len(out)) + out)
        answer = _answer(self.sock)
        assert answer, "the broker closed the connection"
        _header, pos = codec.decode(messages.ResponseHeader,
                                    codec.response_header_version(api_key, version), answer)
        return codec.decode(messages.APIS[api_key][1], version, answer, pos)[0]

    def close(self) -> None:
        self.sock.close()


def test_a_hidden_topic_asked_for_by_id_keeps_its_name_secret(cluster):
    from api.broker.kafka_listener import topic_uuid
    with Admin([cluster.nodes[b].broker_url for b in cluster.broker_ids],
               **cluster.client_security) as admin:
        hidden_id = topic_uuid(admin.describe_topics([SECRET_TOPIC])[SECRET_TOPIC].topic_id)
    session = _Session(cluster, WRITER)
    try:
        [topic] = session.call(3, 12, {"Topics": [{"TopicId": hidden_id, "Name": None}],
                                       "AllowAutoTopicCreation": False,
                                       "IncludeTopicAuthorizedOperations": False})["Topics"]
        assert (topic["ErrorCode"], topic["Name"], topic["Partitions"]) == (29, None, [])
        [deleted] = session.call(20, 6, {"Topics": [{"Name": None, "TopicId": hidden_id}],
                                         "TimeoutMs": 10_000})["Responses"]
        assert (deleted["ErrorCode"], deleted["Name"], deleted["TopicId"]) == (
            29, None, hidden_id)
    finally:
        session.close()
    with Admin([cluster.nodes[b].broker_url for b in cluster.broker_ids],
               **cluster.client_security) as admin:
        assert SECRET_TOPIC in admin.list_topics()


def test_a_classic_member_is_not_given_nor_shown_a_topic_it_may_not_see(cluster):
    import uuid

    from protocol.kafka import codec, messages
    # The reader may READ the group and TOPIC, nothing of SECRET_TOPIC.
    sessions = [_Session(cluster, READER, node) for node in range(3)]
    try:
        node_id = sessions[0].call(10, 3, {"Key": GROUP, "KeyType": 0})["NodeId"]
        session = sessions[sorted(cluster.broker_ids).index(node_id)]
        subscription = struct.pack(">h", 0) + bytes(codec.encode(
            messages.ConsumerProtocolSubscription, 0,
            {"Topics": [TOPIC, SECRET_TOPIC], "UserData": None}))
        member_id = f"raw-{uuid.uuid4()}"
        joined = session.call(11, 5, {
            "GroupId": GROUP, "SessionTimeoutMs": 30_000, "RebalanceTimeoutMs": 30_000,
            "MemberId": member_id, "GroupInstanceId": None, "ProtocolType": "consumer",
            "Protocols": [{"Name": "range", "Metadata": subscription}]})
        assert joined["ErrorCode"] == 0, joined
        synced = session.call(14, 3, {
            "GroupId": GROUP, "GenerationId": joined["GenerationId"],
            "MemberId": joined["MemberId"], "GroupInstanceId": None, "Assignments": []})
        assert synced["ErrorCode"] == 0, synced
        assignment, _ = codec.decode(messages.ConsumerProtocolAssignment, 0,
                                     synced["Assignment"], 2)
        assert {t["Topic"] for t in assignment["AssignedPartitions"]} <= {TOPIC}
        [described] = session.call(15, 4, {"Groups": [GROUP],
                                           "IncludeAuthorizedOperations": False})["Groups"]
        for member in described["Members"]:
            assert SECRET_TOPIC.encode() not in member["MemberMetadata"]
            assert SECRET_TOPIC.encode() not in member["MemberAssignment"]
        session.call(13, 3, {"GroupId": GROUP, "Members": [
            {"MemberId": joined["MemberId"], "GroupInstanceId": None}]})
    finally:
        for s in sessions:
            s.close()
