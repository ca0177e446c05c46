"""SCRAM credentials (RFC 5802, RFC 7677), stored as Kafka stores them.

A user's password is never stored or sent in clear to the cluster: the
admin client salts and iterates it (PBKDF2-HMAC, ``salted_password``), the
controller keeps only ``StoredKey = H(HMAC(SaltedPassword, "Client Key"))``
and ``ServerKey = HMAC(SaltedPassword, "Server Key")`` with the salt and the
iteration count (Kafka's ``UserScramCredentialRecord``). A broker checks a
password a client presents over TLS (HTTP Basic) by deriving the stored key
from it and comparing, in constant time; a full SCRAM exchange (the Kafka
protocol's) can be checked against the same credential.

Credentials are metadata configs of resource type ``user-scram``: the name
is the user, the config name the mechanism, the value ``encode``'s string.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from typing import NamedTuple

USER_SCRAM_RESOURCE = "user-scram"
MECHANISMS = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
ITERATIONS_MIN = 4096  # Kafka's minimum
ITERATIONS_MAX = 16384
ITERATIONS_DEFAULT = 8192
USER_NAME_CHARS_MAX = 255
SALT_BYTES = 32


class ScramCredential(NamedTuple):
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


def check_mechanism(mechanism: str) -> str:
    if mechanism not in MECHANISMS:
        raise ValueError(f"unknown SCRAM mechanism {mechanism!r}: use "
                         f"{' or '.join(MECHANISMS)}")
    return mechanism


def check_user_name(name: object) -> str:
    """A SCRAM user's name: its principal is ``User:<name>``, which must not
    pass for an anonymous client's or a certificate's (``CN=...,O=...``)."""
    if not isinstance(name, str) or not 0 < len(name) <= USER_NAME_CHARS_MAX \
            or not name.isprintable() or any(c in name for c in ":=,"):
        raise ValueError(f"a user name is 1-{USER_NAME_CHARS_MAX} printable characters "
                         f"without ':', '=' or ',', not {name!r}")
    if name.upper() == "ANONYMOUS":
        raise ValueError("ANONYMOUS is the name of clients that do not authenticate")
    return name


def digest_size(mechanism: str) -> int:
    return hashlib.new(MECHANISMS[mechanism]).digest_size


def check_iterations(iterations: object) -> int:
    if not isinstance(iterations, int) or isinstance(iterations, bool) \
            or not ITERATIONS_MIN <= iterations <= ITERATIONS_MAX:
        raise ValueError(f"iterations must be an integer in [{ITERATIONS_MIN}, "
                         f"{ITERATIONS_MAX}], not {iterations!r}")
    return iterations


def salted_password(password: str, salt: bytes, iterations: int, mechanism: str) -> bytes:
    """Hi(Normalize(password), salt, i): PBKDF2 with HMAC of the mechanism's
    hash (SASLprep is left out: passwords are taken as their UTF-8 bytes)."""
    return hashlib.pbkdf2_hmac(MECHANISMS[mechanism], password.encode(), salt, iterations)


def new_salt() -> bytes:
    return os.urandom(SALT_BYTES)


def credential(salted: bytes, salt: bytes, iterations: int, mechanism: str
               ) -> ScramCredential:
    digest = MECHANISMS[mechanism]
    client_key = hmac.new(salted, b"Client Key", digest).digest()
    return ScramCredential(salt, iterations, hashlib.new(digest, client_key).digest(),
                           hmac.new(salted, b"Server Key", digest).digest())


def encode(cred: ScramCredential) -> str:
    b64 = base64.b64encode
    return ",".join((b64(cred.salt).decode(), str(cred.iterations),
                     b64(cred.stored_key).decode(), b64(cred.server_key).decode()))


def decode(value: str) -> ScramCredential:
    salt, iterations, stored, server = value.split(",")
    return ScramCredential(base64.b64decode(salt), int(iterations), base64.b64decode(stored),
                           base64.b64decode(server))


def verify(password: str, cred: ScramCredential, mechanism: str) -> bool:
    """Whether ``password`` is the one ``cred`` was made from."""
    derived = credential(salted_password(password, cred.salt, cred.iterations, mechanism),
                         cred.salt, cred.iterations, mechanism)
    return hmac.compare_digest(derived.stored_key, cred.stored_key)


class ScramError(ValueError):
    """A SCRAM exchange that cannot go on: a malformed message, or a proof
    that is wrong (the client's password, or no such user)."""


def _attributes(message: str) -> list[tuple[str, str]]:
    """``a=value`` pairs of a SCRAM message, in order (RFC 5802 section 7;
    Kafka's extensions, such as ``tokenauth=true``, have longer names)."""
    pairs = []
    for part in message.split(","):
        name, sep, value = part.partition("=")
        if not sep or not name.isalpha() or not name.isascii():
            raise ScramError(f"not a SCRAM attribute: {part[:40]!r}")
        pairs.append((name, value))
    return pairs


def _sasl_name(text: str) -> str:
    """A saslname's value: ``=2C`` is a comma, ``=3D`` an equals sign, and
    no other ``=`` may stand in it."""
    if "=" in text.replace("=2C", "").replace("=3D", ""):
        raise ScramError("a user name with '=' not written as =2C or =3D")
    return text.replace("=2C", ",").replace("=3D", "=")


class ScramServer:
    """The server's side of one SCRAM exchange (RFC 5802, without channel
    binding, as Kafka speaks it): ``first(client_first)`` answers the
    server-first message, ``final(client_final)`` checks the client's proof
    and answers the server-final message, after which ``user`` is proven.

    ``credential(user)`` gives the user's ``ScramCredential`` for this
    mechanism, or None. A user without one is answered as if it had one (a
    salt made from ``pepper``, the mechanism and its name, so it is the same
    every time; the same on every node when the nodes share ``pepper``) and
    fails at the proof, after the same work as a wrong password: the
    exchange does not tell who exists."""

    NONCE_BYTES = 24

    def __init__(self, mechanism: str, credential, pepper: bytes, *,
                 nonce_suffix: str | None = None) -> None:
        """``nonce_suffix``: the server's part of the nonce (random unless
        given: RFC 7677's test vector gives one)."""
        self.mechanism = check_mechanism(mechanism)
        self.digest = MECHANISMS[mechanism]
        self._credential = credential
        self._pepper = pepper
        #: Who the client proved to be, once ``final`` has checked it.
        self.user: str | None = None
        #: ``first`` has answered: the next message is the client-final.
        self.started = False
        self._user = ""
        self._cred: ScramCredential | None = None
        self._client_first_bare = ""
        self._server_first = ""
        self._nonce = ""
        self._gs2 = ""
        self.extensions: dict[str, str] = {}
        self._suffix = nonce_suffix

    def first(self, message: bytes) -> bytes:
        if self.started:
            raise ScramError("a second client-first message")
        self.started = True
        try:
            text = message.decode()
        except UnicodeDecodeError:
            raise ScramError("the client-first message is not UTF-8") from None
        flag, sep, rest = text.partition(",")
        authzid, sep2, bare = rest.partition(",")
        if not sep or not sep2 or flag not in ("n", "y"):
            raise ScramError("the client-first message must start n,, (kraftlog does no "
                             "channel binding)")
        self._gs2 = f"{flag},{authzid},"
        attributes = _attributes(bare)
        if len(attributes) < 2 or attributes[0][0] != "n" or attributes[1][0] != "r":
            raise ScramError("the client-first message must name the user (n=) and then "
                             "its nonce (r=)")
        user = _sasl_name(attributes[0][1])
        if authzid and (not authzid.startswith("a=") or _sasl_name(authzid[2:]) != user):
            raise ScramError("an authorization id other than the user's own is not allowed")
        client_nonce = attributes[1][1]
        if not client_nonce or not client_nonce.isprintable():
            raise ScramError("an empty or unprintable client nonce")
        self.extensions = dict(attributes[2:])
        if self.extensions.get("tokenauth", "").lower() == "true":
            raise ScramError("delegation tokens log in over kraftlog's HTTP API, not with SCRAM "
                             "(tokenauth): log in with a user's password")
        self._client_first_bare = bare
        self._cred = self._credential(user)
        self._user = user
        if self._cred is None:  # answered alike, refused at the proof
            decoy = hmac.new(self._pepper, f"{self.mechanism}\0{user}".encode(),
                             hashlib.sha256).digest()[:SALT_BYTES]
            size = digest_size(self.mechanism)
            # Keys nobody's proof matches: checked like any (no shortcut).
            self._cred = ScramCredential(decoy, ITERATIONS_DEFAULT, os.urandom(size),
                                         os.urandom(size))
        self._nonce = client_nonce + (self._suffix or base64.b64encode(
            os.urandom(self.NONCE_BYTES)).decode())
        self._server_first = (f"r={self._nonce},s={base64.b64encode(self._cred.salt).decode()},"
                              f"i={self._cred.iterations}")
        return self._server_first.encode()

    def final(self, message: bytes) -> bytes:
        """The server-final message; raises ``ScramError`` on a wrong proof."""
        if self._cred is None:
            raise ScramError("the client-final message came before the client-first")
        try:
            text = message.decode()
        except UnicodeDecodeError:
            raise ScramError("the client-final message is not UTF-8") from None
        without_proof, sep, proof_part = text.rpartition(",p=")
        if not sep:
            raise ScramError("the client-final message has no proof (p=)")
        attributes = dict(_attributes(without_proof))
        if attributes.get("r") != self._nonce:
            raise ScramError("the client-final message's nonce is not the exchange's")
        try:
            binding = base64.b64decode(attributes.get("c", ""), validate=True).decode()
            proof = base64.b64decode(proof_part, validate=True)
        except (ValueError, UnicodeDecodeError):
            raise ScramError("the channel binding or the proof is not base64") from None
        if binding != self._gs2:
            raise ScramError("the channel binding does not repeat the client-first header")
        auth_message = ",".join((self._client_first_bare, self._server_first,
                                 without_proof)).encode()
        cred = self._cred
        signature = hmac.new(cred.stored_key, auth_message, self.digest).digest()
        if len(proof) != len(signature):
            raise ScramError("wrong user name or password")
        client_key = bytes(a ^ b for a, b in zip(proof, signature))
        if not hmac.compare_digest(hashlib.new(self.digest, client_key).digest(),
                                   cred.stored_key):
            raise ScramError("wrong user name or password")
        server_signature = hmac.new(cred.server_key, auth_message, self.digest).digest()
        self.user = self._user
        return b"v=" + base64.b64encode(server_signature)
