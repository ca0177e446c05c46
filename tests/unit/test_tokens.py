"""Delegation tokens: the controller makes, renews and expires them as
metadata records; a node checks a bearer token's HMAC and expiry."""

from __future__ import annotations

import time

import msgpack
import pytest

from kraft.controller import Controller, ControllerSettings
from kraft.image import MetadataImage
from kraft.records import decode
from protocol import tls, tokens
from protocol.errors import (DelegationTokenExpiredError, DelegationTokenNotFoundError,
                             DelegationTokenOwnerMismatchError, InvalidRequestError)

DAY = 86_400_000
SECRET = b"a-secret-of-sixteen-or-more"


def controller() -> Controller:
    return Controller(ControllerSettings(token_expiry_ms=DAY, token_max_lifetime_ms=7 * DAY))


def applied(image: MetadataImage, result) -> MetadataImage:
    for record in result.records:
        assert decode(record.encode()) == record
        image.apply(record, image.offset + 1)
    return image


def created(image: MetadataImage, now: int, **body) -> tuple[MetadataImage, dict]:
    result = controller().create_delegation_token(image, {
        "owner": "User:erin", "requester": "User:erin", **body}, now)
    return applied(image, result), result.response["token"]


def test_a_token_lasts_its_expiry_time_renewable_up_to_its_maximum():
    image, token = created(MetadataImage(), 1000, renewers=["User:bob", "User:bob"])
    assert (token["issue_timestamp_ms"], token["expiration_timestamp_ms"],
            token["max_timestamp_ms"]) == (1000, 1000 + DAY, 1000 + 7 * DAY)
    stored = image.delegation_tokens[token["token_id"]]
    assert stored.owner == "User:erin" and stored.renewers == ("User:bob",)
    assert MetadataImage.from_snapshot(image.to_snapshot()).delegation_tokens == \
        image.delegation_tokens
    core = controller()
    renew = {"token_id": token["token_id"], "requester": "User:bob"}
    result = core.renew_delegation_token(image, renew, 1000 + DAY - 1)  # still live
    assert result.response["expiration_timestamp_ms"] == 1000 + 2 * DAY - 1
    applied(image, result)
    result = core.renew_delegation_token(image, {**renew, "renew_period_ms": 5}, 2000)
    assert result.response["expiration_timestamp_ms"] == 2005
    short, token = created(MetadataImage(), 1000, max_lifetime_ms=DAY + 100)
    result = core.renew_delegation_token(short, {"token_id": token["token_id"],
                                                 "requester": "User:erin"}, 1000 + DAY - 1)
    assert result.response["expiration_timestamp_ms"] == 1000 + DAY + 100  # its maximum
    # A shorter maximum lifetime asked for is kept; a longer one is capped.
    assert created(MetadataImage(), 0, max_lifetime_ms=10)[1]["max_timestamp_ms"] == 10
    assert created(MetadataImage(), 0, max_lifetime_ms=9 * DAY)[1]["max_timestamp_ms"] == \
        7 * DAY


def test_only_the_owner_or_a_renewer_renews_or_expires_a_live_token():
    image, token = created(MetadataImage(), 1000, renewers=["User:bob"])
    core = controller()
    body = {"token_id": token["token_id"], "requester": "User:mallory"}
    with pytest.raises(DelegationTokenOwnerMismatchError):
        core.renew_delegation_token(image, body, 2000)
    with pytest.raises(DelegationTokenOwnerMismatchError):
        core.expire_delegation_token(image, body, 2000)
    with pytest.raises(DelegationTokenNotFoundError):
        core.renew_delegation_token(image, {**body, "token_id": "nope"}, 2000)
    with pytest.raises(DelegationTokenExpiredError):
        core.renew_delegation_token(image, {**body, "requester": "User:erin"}, 2000 + DAY)
    with pytest.raises(InvalidRequestError):
        core.create_delegation_token(image, {"owner": "erin", "requester": "User:erin"}, 0)


def test_expiring_now_removes_a_token_and_the_controller_sweeps_expired_ones():
    image, token = created(MetadataImage(), 1000)
    core = controller()
    later = core.expire_delegation_token(image, {
        "token_id": token["token_id"], "requester": "User:erin", "expiry_period_ms": 50}, 1000)
    assert later.response["expiration_timestamp_ms"] == 1050
    applied(image, later)
    assert core.expired_delegation_tokens(image, 1050) == []
    assert [r.token_id for r in core.expired_delegation_tokens(image, 1051)] == [
        token["token_id"]]
    now = core.expire_delegation_token(image, {
        "token_id": token["token_id"], "requester": "User:erin"}, 1000)
    assert applied(image, now).delegation_tokens == {}


def test_a_node_accepts_a_genuine_live_token_and_nothing_else():
    now = int(time.time() * 1000)
    image, token = created(MetadataImage(), now)
    verifier = tls.PasswordVerifier(lambda _user: {}, token_info=image.delegation_tokens.get,
                                    token_secret=SECRET)
    token_id = token["token_id"]
    value = tokens.bearer(token_id, tokens.token_hmac(SECRET, token_id))
    assert verifier.authenticate_token(value) == "User:erin"
    other_secret = tokens.bearer(token_id, tokens.token_hmac(b"another-secret-entirely", token_id))
    for bad in (other_secret, token_id, value + "x", "x." + value.split(".")[1],
                tokens.bearer("unknown", tokens.token_hmac(SECRET, "unknown"))):
        assert verifier.authenticate_token(bad) is None, bad
    expired, _ = created(MetadataImage(), now - 2 * DAY)
    (old_id,) = expired.delegation_tokens
    stale = tls.PasswordVerifier(lambda _user: {}, token_info=expired.delegation_tokens.get,
                                 token_secret=SECRET)
    assert stale.authenticate_token(tokens.bearer(old_id, tokens.token_hmac(SECRET, old_id))) \
        is None
    no_secret = tls.PasswordVerifier(lambda _user: {}, token_info=image.delegation_tokens.get)
    assert no_secret.authenticate_token(value) is None


def test_without_acls_a_token_may_do_no_more_than_a_password():
    # A token's owner may be a SCRAM user: what only nodes may do (a
    # follower's fetch, markers) stays refused to a token as to a password.
    from protocol.errors import ClusterAuthorizationFailedError
    for proof in ("password", "token"):
        with pytest.raises(ClusterAuthorizationFailedError):
            tls.require_node_or_plain({tls.PROOF_KEY: proof}, "a follower's fetch")
    tls.require_node_or_plain({tls.PROOF_KEY: "certificate"}, "a follower's fetch")
    assert tls.NOT_A_NODE == {"password", "token"}


def test_a_record_for_an_existing_token_may_change_only_its_expiry():
    from kraft.records import DelegationTokenRecord
    from protocol.errors import MetadataApplyError
    image, token = created(MetadataImage(), 1000, renewers=["User:bob"])
    fields = {**token, "renewers": ["User:bob"]}
    for change in ({"owner": "User:mallory"}, {"requester": "User:mallory"},
                   {"renewers": ["User:bob", "User:mallory"]},
                   {"max_timestamp_ms": token["max_timestamp_ms"] + DAY},
                   {"expiration_timestamp_ms": token["issue_timestamp_ms"] - 1}):
        with pytest.raises(MetadataApplyError):
            image.apply(DelegationTokenRecord(**{**fields, **change}), image.offset + 1)
    assert image.delegation_tokens[token["token_id"]].owner == "User:erin"
    # A snapshot's tokens are checked as a record's are.
    snapshot = image.to_snapshot()
    for bad in ({"owner": 7}, {"expiration_timestamp_ms": token["max_timestamp_ms"] + 1},
                {"surprise": 1}):
        raw = msgpack.unpackb(snapshot)
        raw["delegation_tokens"][0].update(bad)
        with pytest.raises(MetadataApplyError):
            MetadataImage.from_snapshot(msgpack.packb(raw))
    assert MetadataImage.from_snapshot(snapshot).delegation_tokens == image.delegation_tokens


def test_token_times_stay_int64_and_the_cluster_caps_the_number_of_tokens(monkeypatch):
    import kraft.controller as controller_module
    huge = Controller(ControllerSettings(token_expiry_ms=2**63 - 1,
                                         token_max_lifetime_ms=2**63 - 1))
    result = huge.create_delegation_token(MetadataImage(), {
        "owner": "User:erin", "requester": "User:erin"}, 10**12)
    token = result.response["token"]
    assert token["max_timestamp_ms"] == token["expiration_timestamp_ms"] == 2**63 - 1
    applied(MetadataImage(), result)  # encodes and applies
    monkeypatch.setattr(controller_module, "TOKENS_MAX", 2)
    image, _ = created(MetadataImage(), 1000)
    image, _ = created(image, 1000)
    with pytest.raises(InvalidRequestError, match="the most it may"):
        created(image, 1000)


def test_the_sweep_sees_tokens_made_renewed_or_removed_since_the_last_tick():
    core = controller()
    image, first = created(MetadataImage(), 1000)
    assert core.expired_delegation_tokens(image, 1000 + DAY) == []
    image, second = created(image, 0)  # expires at DAY, before the first
    assert [r.token_id for r in core.expired_delegation_tokens(image, DAY + 1)] == [
        second["token_id"]]
    draft = image.copy()  # a draft that removes it: the original keeps it
    applied(draft, core.expire_delegation_token(draft, {
        "token_id": second["token_id"], "requester": "User:erin"}, 10))
    assert core.expired_delegation_tokens(draft, DAY + 1) == []
    assert len(core.expired_delegation_tokens(image, DAY + 1)) == 1
    assert len(core.expired_delegation_tokens(image, 1001 + DAY)) == 2


def test_the_authorization_scheme_is_case_insensitive():
    # RFC 7235: "bearer" and "BASIC" are the same schemes as "Bearer" and "Basic".
    assert tls.auth_scheme("bearer abc.def") == ("bearer", "abc.def")
    assert tls.auth_scheme("BASIC  dXNlcjpwdw== ") == ("basic", "dXNlcjpwdw==")
    assert tls.auth_scheme(None) == ("", "") and tls.auth_scheme("Bearer") == ("bearer", "")


def test_the_cli_refuses_an_empty_token_file_or_a_token_without_sasl_ssl(tmp_path):
    import argparse

    from api.cli_support import CliError, configure_security
    empty, token = tmp_path / "empty.token", tmp_path / "job.token"
    empty.write_text("\n")
    token.write_text("abc.def\n")

    def args(protocol: str, token_file: str, username: str | None = None):
        return argparse.Namespace(security_protocol=protocol, ssl_cafile=None,
                                  ssl_certfile=None, ssl_keyfile=None, sasl_username=username,
                                  sasl_password_file=None, sasl_token_file=token_file)
    with pytest.raises(CliError, match="must be a delegation token"):
        configure_security(args("SASL_SSL", str(empty)))
    for protocol in ("SSL", "PLAINTEXT"):
        with pytest.raises(CliError, match="are for --security-protocol SASL_SSL"):
            configure_security(args(protocol, str(token)))
        with pytest.raises(CliError, match="are for --security-protocol SASL_SSL"):
            configure_security(args(protocol, None, username="erin"))
    configure_security(args("PLAINTEXT", None))  # and back to no credentials
