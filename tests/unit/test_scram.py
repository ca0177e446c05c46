"""SCRAM credentials against RFC 7677's test exchange, and the broker's
password check (HTTP Basic against stored SCRAM keys, remembered per
credential)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac

import pytest

from protocol import scram
from protocol.tls import PasswordVerifier

# RFC 7677, section 3: user "user", password "pencil".
SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
AUTH_MESSAGE = (b"n=user,r=rOprNGfwEbeRWgbNEkqO,"
                b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096,"
                b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
CLIENT_PROOF = base64.b64decode("dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
SERVER_SIGNATURE = base64.b64decode("6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")


def test_the_stored_and_server_keys_match_rfc_7677():
    salted = scram.salted_password("pencil", SALT, 4096, "SCRAM-SHA-256")
    cred = scram.credential(salted, SALT, 4096, "SCRAM-SHA-256")
    assert hmac.new(cred.server_key, AUTH_MESSAGE, "sha256").digest() == SERVER_SIGNATURE
    signature = hmac.new(cred.stored_key, AUTH_MESSAGE, "sha256").digest()
    client_key = bytes(a ^ b for a, b in zip(CLIENT_PROOF, signature))
    assert hashlib.sha256(client_key).digest() == cred.stored_key
    assert scram.decode(scram.encode(cred)) == cred
    assert scram.verify("pencil", cred, "SCRAM-SHA-256")
    assert not scram.verify("pencil!", cred, "SCRAM-SHA-256")


@pytest.mark.parametrize("check, value, message", [
    (scram.check_mechanism, "SCRAM-SHA-1", "unknown SCRAM mechanism"),
    (scram.check_iterations, 100, r"\[4096, 16384\]"),
    (scram.check_iterations, True, "integer"),
    (scram.check_user_name, "", "1-255 printable"),
    (scram.check_user_name, "a:b", "without ':'"),
])
def test_bad_users_are_refused(check, value, message):
    with pytest.raises(ValueError, match=message):
        check(value)


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_the_password_check_remembers_per_credential_and_forgets_a_changed_one():
    salt = scram.new_salt()
    stored = {"etl": {"SCRAM-SHA-512": scram.encode(scram.credential(
        scram.salted_password("s3cret-pw", salt, 4096, "SCRAM-SHA-512"), salt, 4096,
        "SCRAM-SHA-512"))}}
    verifier = PasswordVerifier(lambda user: stored.get(user, {}))

    def auth(header):
        return asyncio.run(verifier.authenticate(header))
    assert auth(basic("etl", "s3cret-pw")) == "etl"
    assert auth(basic("etl", "s3cret-pw")) == "etl"  # remembered
    assert auth("basic" + basic("etl", "s3cret-pw")[5:]) == "etl"  # the scheme in any case
    assert auth(basic("etl", "wrong")) is None
    assert auth(basic("nobody", "s3cret-pw")) is None
    for bad in (None, "Bearer x", "Basic !!!", "Basic " + base64.b64encode(b"nocolon").decode()):
        assert auth(bad) is None
    del stored["etl"]  # deleted: a remembered success must not outlive it
    assert auth(basic("etl", "s3cret-pw")) is None


def test_a_new_password_is_checked_afresh_and_a_success_is_remembered(monkeypatch):
    def cred(password: str) -> str:
        salt = scram.new_salt()
        return scram.encode(scram.credential(
            scram.salted_password(password, salt, 4096, "SCRAM-SHA-512"), salt, 4096,
            "SCRAM-SHA-512"))
    stored = {"etl": {"SCRAM-SHA-512": cred("first-password")}}
    verifier = PasswordVerifier(lambda user: stored.get(user, {}))
    calls = []
    real = scram.verify
    monkeypatch.setattr(scram, "verify", lambda *a: calls.append(a) or real(*a))

    def auth(user, password):
        return asyncio.run(verifier.authenticate(basic(user, password)))
    assert auth("etl", "first-password") == "etl"
    assert auth("etl", "first-password") == "etl" and len(calls) == 1  # remembered
    stored["etl"] = {"SCRAM-SHA-512": cred("second-password")}   # set-password
    assert auth("etl", "first-password") is None                # the old one no longer works
    assert auth("etl", "second-password") == "etl"


def test_an_unknown_user_is_retriable_until_the_users_are_loaded():
    from protocol.errors import BrokerNotAvailableError
    loaded = {"yes": False}
    verifier = PasswordVerifier(lambda user: {}, lambda: loaded["yes"])
    with pytest.raises(BrokerNotAvailableError):
        asyncio.run(verifier.authenticate(basic("etl", "pw-123456")))
    loaded["yes"] = True
    assert asyncio.run(verifier.authenticate(basic("etl", "pw-123456"))) is None


# -- the server's side of the exchange (the Kafka listener's SaslAuthenticate) ------------
SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
CLIENT_FINAL = (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")


def _pencil() -> scram.ScramCredential:
    return scram.credential(scram.salted_password("pencil", SALT, 4096, "SCRAM-SHA-256"),
                            SALT, 4096, "SCRAM-SHA-256")


def _server(users: dict) -> scram.ScramServer:
    return scram.ScramServer("SCRAM-SHA-256", users.get, b"pepper",
                             nonce_suffix=SERVER_NONCE)


def test_the_server_side_of_rfc_7677s_exchange_proves_the_user():
    server = _server({"user": _pencil()})
    assert server.first(CLIENT_FIRST) == (b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF"
                                          b"$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
    assert server.user is None  # not before the proof
    assert server.final(CLIENT_FINAL) == b"v=" + base64.b64encode(SERVER_SIGNATURE)
    assert server.user == "user"


def test_a_wrong_password_and_an_unknown_user_fail_alike_at_the_proof():
    wrong = scram.credential(scram.salted_password("pencil!", SALT, 4096, "SCRAM-SHA-256"),
                             SALT, 4096, "SCRAM-SHA-256")
    for users in ({"user": wrong}, {}):
        server = _server(users)
        first = server.first(CLIENT_FIRST)
        assert first.startswith(b"r=rOprNGfwEbeRWgbNEkqO%hvYD") and b",i=" in first
        with pytest.raises(scram.ScramError, match="wrong user name or password"):
            server.final(CLIENT_FINAL)
        assert server.user is None
    # An unknown user's made-up salt is the same each time (it reveals nothing).
    assert _server({}).first(CLIENT_FIRST) == _server({}).first(CLIENT_FIRST)


@pytest.mark.parametrize("first, final, message", [
    (b"p=tls-unique,,n=user,r=abc", None, "channel binding"),
    (b"n,,r=abc,n=user", None, "name the user"),
    (b"n,a=other,n=user,r=abc", None, "authorization id"),
    (b"n,,n=us=er,r=abc", None, "=2C or =3D"),
    (b"\xff", None, "UTF-8"),
    (CLIENT_FIRST, b"c=biws,r=someone-elses-nonce,p=AAAA", "nonce"),
    (CLIENT_FIRST, b"c=eSws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                   b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=", "channel binding"),
    (CLIENT_FIRST, b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0",
     "no proof"),
    (CLIENT_FIRST, b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=!!",
     "base64"),
])
def test_malformed_messages_are_refused_saying_why(first, final, message):
    server = _server({"user": _pencil()})
    with pytest.raises(scram.ScramError, match=message):
        server.first(first)
        server.final(final)
    assert server.user is None


def test_a_second_client_first_message_is_refused():
    server = _server({"user": _pencil()})
    server.first(CLIENT_FIRST)
    with pytest.raises(scram.ScramError, match="second"):
        server.first(CLIENT_FIRST)


def test_an_unknown_users_salt_differs_per_mechanism_as_a_real_users_does():
    first = CLIENT_FIRST
    sha256 = scram.ScramServer("SCRAM-SHA-256", {}.get, b"pepper").first(first)
    sha512 = scram.ScramServer("SCRAM-SHA-512", {}.get, b"pepper").first(first)
    salt = [dict(p.split("=", 1) for p in m.decode().split(","))["s"] for m in (sha256, sha512)]
    assert salt[0] != salt[1]
    assert len(base64.b64decode(salt[0])) == scram.SALT_BYTES  # as long as a real one


@pytest.mark.parametrize("first, message", [
    (b"n,,n=user,r=abc,tokenauth=true", "delegation tokens"),
    (b"n,user,n=user,r=abc", "authorization id"),  # an authzid without a=
])
def test_token_logins_and_bare_authorization_ids_are_refused(first, message):
    with pytest.raises(scram.ScramError, match=message):
        _server({"user": _pencil()}).first(first)


def test_an_extension_is_kept_and_the_exchange_goes_on():
    server = _server({"user": _pencil()})
    server.first(CLIENT_FIRST + b",ext=1")
    assert server.extensions == {"ext": "1"}
