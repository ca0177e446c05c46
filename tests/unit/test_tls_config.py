"""TLS settings: what a node and a client accept, and what they refuse in
words that say what to do. (Real handshakes: tests/integration/test_tls.py.)"""

from __future__ import annotations

import datetime

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
    ({"listener.security.protocol.map": "BROKER:SASL_SSL,CONTROLLER:SSL"},
     "SASL authentication is not available yet"),
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
    with pytest.raises(ValueError, match="SASL authentication is not available yet"):
        Producer("127.0.0.1:9092", security_protocol="SASL_SSL")
    with pytest.raises(ValueError, match="PLAINTEXT or SSL"):
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
