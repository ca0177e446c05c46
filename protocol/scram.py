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
