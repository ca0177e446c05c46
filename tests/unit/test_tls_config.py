"""TLS settings: what a node and a client accept, and what they refuse in
words that say what to do. (Real handshakes: tests/integration/test_tls.py.)"""

from __future__ import annotations

import datetime
import ssl

import pytest

from api import certs
from api.client import Admin, Producer
from kraft.config import node_config_from_settings
from kraft.controller import _endpoints
from protocol import tls
from protocol.errors import InvalidConfigError, InvalidRequestError
from protocol.fields import Fields

COMBINED = {"node.id": 1, "process.roles": "broker,controller",
            "controller.quorum.voters": "1@127.0.0.1:9093",
            "listeners": "BROKER://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093",
            "log.dirs": "/tmp/unused"}


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    return certs.create(str(tmp_path_factory.mktemp("certs")), nodes=1)


def secure(made, **extra) -> dict:
    return {**COMBINED, "listener.security.protocol.map": "BROKER:SSL,CONTROLLER:SSL",
            "ssl.certfile": made["node-1"].certfile, "ssl.keyfile": made["node-1"].keyfile,
            "ssl.cafile": made["ca"].certfile, **extra}


def test_ssl_listeners_are_https_everywhere_a_peer_or_client_learns_them(made):
    config = node_config_from_settings(secure(made))
    assert config.listeners["BROKER"].url == "https://127.0.0.1:9092"
    assert config.listeners["BROKER"].registered == "https://127.0.0.1:9092"
    assert config.controller_urls == {1: "https://127.0.0.1:9093"}
    assert config.tls.server is not None and config.tls.peer is not None
    # The default stays plain, with no TLS context at all.
    plain = node_config_from_settings(COMBINED)
    assert plain.tls is None and plain.listeners["BROKER"].registered == "127.0.0.1:9092"
    # One listener SSL, the other plain.
    mixed = node_config_from_settings(
        secure(made, **{"listener.security.protocol.map": "BROKER:SSL,CONTROLLER:PLAINTEXT"}))
    assert mixed.listeners["BROKER"].tls and not mixed.listeners["CONTROLLER"].tls
    assert mixed.controller_urls == {1: "http://127.0.0.1:9093"}


@pytest.mark.parametrize("change, message", [
    ({"ssl.certfile": None, "ssl.keyfile": None}, "set ssl.certfile and ssl.keyfile"),
    ({"ssl.certfile": "/nowhere/cert.pem"}, "not found: /nowhere/cert.pem"),
    ({"listener.security.protocol.map": "BROKER:SASL_PLAINTEXT,CONTROLLER:SSL"},
     "would send passwords in clear"),
    ({"listener.security.protocol.map": "BROKER:SASL_SSL,CONTROLLER:SSL", "ssl.cafile": None},
     "accepts client certificates too"),
    ({"listener.security.protocol.map": "BROKER:SASL_SSL,CONTROLLER:PLAINTEXT"},
     "none as PLAINTEXT"),
    ({"listener.security.protocol.map": "CONTROLLER:SSL,BROKER:SSL,EXT:SASL_SSL"},
     "kraftlog's listeners are BROKER, CONTROLLER and KAFKA"),
    ({"listener.security.protocol.map": "BROKER:SSL,CONTROLLER:SASL_SSL"},
     "CONTROLLER = SASL_SSL"),
    ({"listener.security.protocol.map": "BROKER:TLS,CONTROLLER:SSL"}, "use PLAINTEXT or SSL"),
    ({"listener.security.protocol.map": "BROKER:SSL"}, "CONTROLLER has no entry"),
    ({"ssl.client.auth": "required", "ssl.cafile": None}, "needs ssl.cafile"),
    ({"ssl.client.auth": "sometimes"}, "must be one of none, requested, required"),
    ({"ssl.endpoint.identification.algorithm": "dns"}, "use https or ''"),
])
def test_a_node_refuses_tls_settings_it_cannot_use(made, change, message):
    settings = {k: v for k, v in {**secure(made), **change}.items() if v is not None}
    with pytest.raises(InvalidConfigError, match=message):
        node_config_from_settings(settings)


def test_a_node_with_an_expired_certificate_does_not_start(made, tmp_path):
    ca = certs.CertificateAuthority.load(made["ca"])
    long_ago = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=10)
    old = ca.issue(str(tmp_path), "old", "node-1", certs.DEFAULT_HOSTS, days=1,
                   not_before=long_ago)
    with pytest.raises(InvalidConfigError, match="ssl.certfile .* expired on"):
        node_config_from_settings(secure(made, **{"ssl.certfile": old.certfile,
                                                  "ssl.keyfile": old.keyfile}))


def test_a_certificate_that_does_not_match_its_key_is_refused(made):
    with pytest.raises(InvalidConfigError, match="cannot use the certificate"):
        node_config_from_settings(secure(made, **{"ssl.keyfile": made["client"].keyfile}))


def test_clients_take_kafkas_security_names():
    with Admin("127.0.0.1:9092", security_protocol="ssl") as admin:
        assert admin._admin._metadata.bootstrap_urls == ["https://127.0.0.1:9092"]
    with pytest.raises(ValueError, match="needs sasl_plain_username"):
        Producer("127.0.0.1:9092", security_protocol="SASL_SSL")
    with pytest.raises(ValueError, match="password in clear"):
        Producer("127.0.0.1:9092", security_protocol="SASL_PLAINTEXT")
    with pytest.raises(ValueError, match="are for security_protocol='SASL_SSL'"):
        Producer("127.0.0.1:9092", sasl_plain_username="u", sasl_plain_password="p")
    with pytest.raises(ValueError, match="sasl_mechanism must be one of"):
        Producer("127.0.0.1:9092", security_protocol="SASL_SSL", sasl_mechanism="GSSAPI",
                 sasl_plain_username="u", sasl_plain_password="p")
    with pytest.raises(ValueError, match="PLAINTEXT, SSL or SASL_SSL"):
        Producer("127.0.0.1:9092", security_protocol="TLS")
    with pytest.raises(ValueError, match="CA file not found"):
        Producer("127.0.0.1:9092", security_protocol="SSL", ssl_cafile="/nowhere/ca.pem")


@pytest.mark.parametrize("address, ok", [
    ("127.0.0.1:9092", True), ("https://broker-1:9092", True), ("[::1]:9092", True),
    ("http://broker-1:9092", False), ("https://broker-1/x:9092", False),
    ("https://:9092", False), ("broker-1", False)])
def test_the_controller_takes_a_registered_endpoint_as_host_port_or_an_https_url(address, ok):
    body = Fields({"endpoints": {"BROKER": address}}, "request")
    if ok:
        assert _endpoints(body) == {"BROKER": address}
    else:
        with pytest.raises(InvalidRequestError, match="host:port"):
            _endpoints(body)


def test_the_url_of_an_address_follows_its_protocol():
    assert tls.url("h:1", tls.SSL) == "https://h:1"
    assert tls.url("h:1", tls.PLAINTEXT) == "http://h:1"
    assert tls.url("https://h:1", tls.PLAINTEXT) == "https://h:1"


def test_a_client_with_a_ca_file_trusts_that_ca_only(made):
    context = tls.client_context(made["ca"].certfile)
    assert len(context.get_ca_certs()) == 1  # not the system's CAs as well


def test_an_ssl_client_never_sends_to_a_plain_url(made):
    import asyncio

    from api.client import SslAuthenticationError
    from api.client._transport import Security, Transport, bootstrap_urls
    assert bootstrap_urls("http://h:1,g:2", "https") == ["https://h:1", "https://g:2"]
    transport = Transport(security=Security("SSL", made["ca"].certfile))

    async def send() -> None:
        try:
            # As a metadata answer could name it: a broker with a plain listener.
            await transport.request("http://127.0.0.1:9", "/v1/metadata", {})
        finally:
            await transport.close()
    with pytest.raises(SslAuthenticationError, match="sends nothing unencrypted"):
        asyncio.run(send())


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> None:
    """A TLS handshake between two contexts in memory; raises if it fails."""
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    client_side = client.wrap_bio(c_in, c_out, server_hostname="localhost")
    server_side = server.wrap_bio(s_in, s_out, server_side=True)
    for _ in range(10):
        done = 0
        for side, out, peer_in in ((client_side, c_out, s_in), (server_side, s_out, c_in)):
            try:
                side.do_handshake()
                done += 1
            except ssl.SSLWantReadError:
                pass
            peer_in.write(out.read())
        if done == 2:
            return
    raise AssertionError("the handshake did not finish")


def test_a_certificate_replaced_before_its_key_leaves_the_listener_serving(made, tmp_path):
    import shutil
    node = certs.Issued(str(tmp_path / "node.pem"), str(tmp_path / "node-key.pem"))
    shutil.copy(made["node-1"].certfile, node.certfile)
    shutil.copy(made["node-1"].keyfile, node.keyfile)
    server = tls.server_context(node.certfile, node.keyfile)
    reloader = tls.CertificateReloader(server, None, node.certfile, node.keyfile,
                                       made["ca"].certfile)
    client = tls.client_context(made["ca"].certfile)
    ca = certs.CertificateAuthority.load(made["ca"])
    fresh = ca.issue(str(tmp_path), "fresh", "node-1", certs.DEFAULT_HOSTS)
    shutil.copy(fresh.certfile, node.certfile)  # the certificate first: no match yet
    assert reloader.check() is False
    _handshake(server, client)  # still the old pair
    shutil.copy(fresh.keyfile, node.keyfile)
    assert reloader.check() is True
    _handshake(server, client)


def test_certs_create_will_not_replace_certificates_in_use(tmp_path):
    certs.create(str(tmp_path), nodes=1)
    with pytest.raises(FileExistsError, match="--force"):
        certs.create(str(tmp_path), nodes=1)
    assert certs.create(str(tmp_path), nodes=1, force=True)["ca"].certfile


def test_a_cluster_with_password_users_serves_no_anonymous_client_on_ssl(made, monkeypatch):
    """With BROKER:SASL_SSL, the SSL controller listener requires a client
    certificate even though ssl.client.auth is left at none."""
    from aiohttp import web

    from kraft.config import CONTROLLER_LISTENER
    config = node_config_from_settings(
        secure(made, **{"listener.security.protocol.map": "BROKER:SASL_SSL,CONTROLLER:SSL"}))
    assert config.tls.sasl and config.tls.server.verify_mode == ssl.CERT_OPTIONAL
    app = web.Application()
    seen = {}

    def spy(app_, mapper, require_certificate, verifier=None):
        seen[bool(verifier)] = require_certificate
    monkeypatch.setattr(tls, "authenticate_clients", spy)
    config.secure_app(app, config.voters[1])
    config.secure_app(app, config.listeners["BROKER"], lambda user: {})
    with pytest.raises(RuntimeError, match="needs the users' credentials"):
        config.secure_app(app, config.listeners["BROKER"])
    assert seen == {False: True, True: False}  # controller: certificate; broker: password ok
    assert CONTROLLER_LISTENER in config.listeners


KAFKA_LISTENERS = COMBINED["listeners"] + ",KAFKA://127.0.0.1:9095"
ACLS = {"authorizer.class.name": "kraftlog.StandardAuthorizer", "super.users": "User:admin"}


@pytest.mark.parametrize("kafka, tls_on, sasl_on", [
    ("SSL", True, False), ("SASL_SSL", True, True)])
def test_the_kafka_listener_speaks_ssl_or_sasl_ssl_like_the_broker_listener(
        made, kafka, tls_on, sasl_on):
    config = node_config_from_settings(secure(made, **ACLS, **{
        "listener.security.protocol.map": f"BROKER:SASL_SSL,CONTROLLER:SSL,KAFKA:{kafka}"},
        listeners=KAFKA_LISTENERS))
    endpoint = config.listeners["KAFKA"]
    assert (endpoint.tls, endpoint.sasl) == (tls_on, sasl_on)
    # Registered as its URL, which the listener reads back as Kafka's host and port.
    from api.broker.kafka_listener import host_port
    assert host_port(endpoint.registered) == ("127.0.0.1", 9095)
    assert host_port("[::1]:9095") == ("::1", 9095)


@pytest.mark.parametrize("change, message", [
    # With ACLs, a plain listener's callers are all User:ANONYMOUS.
    ({"listener.security.protocol.map": "BROKER:SSL,CONTROLLER:SSL,KAFKA:PLAINTEXT", **ACLS},
     "KAFKA are PLAINTEXT"),
    # A cluster with password users has no plain door.
    ({"listener.security.protocol.map": "BROKER:SASL_SSL,CONTROLLER:SSL,KAFKA:PLAINTEXT"},
     "none as PLAINTEXT"),
])
def test_a_plain_kafka_listener_is_refused_where_a_plain_broker_listener_is(
        made, change, message):
    with pytest.raises(InvalidConfigError, match=message):
        node_config_from_settings(secure(made, **change, listeners=KAFKA_LISTENERS))
    # On a plain cluster it is a broker's listener like the others.
    plain = node_config_from_settings({**COMBINED, "listeners": KAFKA_LISTENERS})
    assert str(plain.listeners["KAFKA"]) == "127.0.0.1:9095"
