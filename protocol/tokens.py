"""Delegation tokens (Kafka's KIP-48): short-lived credentials a user makes
for a job that should not hold the user's password or certificate.

A token is an id and an HMAC: the id is random and public (the metadata
holds it, with its owner and times), the HMAC is HMAC-SHA512 of the id under
the cluster's secret (``delegation.token.secret.key.file``, the same on
every node), so only a node can make or check it and the metadata never
holds it. A client sends both as a bearer token, ``<id>.<hmac>``, on a
SASL_SSL listener, and is its owner for ACLs and quotas. A token expires at
its expiry time, which its owner or a renewer may push back up to its
maximum lifetime; tokens cannot make, renew or expire tokens.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import secrets

#: A token id's random bytes (as unpadded base64url: 22 characters).
TOKEN_ID_BYTES = 16
TOKEN_ID_CHARS_MAX = 64
#: Between the id and the HMAC in a bearer token (neither holds one).
SEPARATOR = "."


@dataclasses.dataclass(frozen=True)
class TokenInfo:
    """A token as the metadata holds it (no HMAC)."""

    token_id: str
    owner: str  # User:<name>, whom the token authenticates as
    requester: str  # who made it
    renewers: tuple[str, ...]
    issue_timestamp_ms: int
    expiration_timestamp_ms: int
    max_timestamp_ms: int

    def may_renew(self, principal: str) -> bool:
        return principal == self.owner or principal in self.renewers

    def to_wire(self) -> dict:
        return {**dataclasses.asdict(self), "renewers": list(self.renewers)}


def new_token_id() -> str:
    return base64.urlsafe_b64encode(secrets.token_bytes(TOKEN_ID_BYTES)).rstrip(b"=").decode()


def token_hmac(secret: bytes, token_id: str) -> str:
    """The token's HMAC (unpadded base64url of HMAC-SHA512 of its id)."""
    digest = hmac.new(secret, token_id.encode(), hashlib.sha512).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def bearer(token_id: str, token_hmac_text: str) -> str:
    """What a client sends: ``<id>.<hmac>``."""
    return f"{token_id}{SEPARATOR}{token_hmac_text}"


def parse_bearer(text: str) -> tuple[str, str] | None:
    """(id, hmac) of a bearer token, or None if it is not shaped as one."""
    token_id, sep, mac = text.strip().partition(SEPARATOR)
    if not sep or not token_id or not mac or len(token_id) > TOKEN_ID_CHARS_MAX:
        return None
    return token_id, mac


def genuine(secret: bytes, token_id: str, mac: str) -> bool:
    """Whether ``mac`` is the token's HMAC (in constant time)."""
    return hmac.compare_digest(token_hmac(secret, token_id).encode(), mac.encode())
