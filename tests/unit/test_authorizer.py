"""kraft.authorizer: Kafka's StandardAuthorizer rules over the ACLs of a
metadata image, the index and cache agreeing with a plain reading of the
rules, and the ACL records in the image and the controller."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kraft.authorizer import AclIndex, AclSettings, Authorizer, decide
from kraft.controller import Controller, ControllerSettings
from kraft.image import MetadataImage
from kraft.records import AccessControlEntryRecord, RemoveAccessControlEntryRecord, decode
from protocol import acl
from protocol.acl import (ALL, ALLOW, ALTER, ALTER_CONFIGS, CLUSTER, CLUSTER_NAME, DENY,
                          DESCRIBE, DESCRIBE_CONFIGS, GROUP, LITERAL, PREFIXED, READ, TOPIC,
                          WRITE, AclBinding, AclBindingFilter)
from protocol.errors import (BrokerNotAvailableError, InvalidRequestError,
                             MetadataApplyError, TopicAuthorizationFailedError)

ALICE, BOB = "User:alice", "User:bob"
HOST = "10.0.0.1"


def b(name="orders", op=READ, permission=ALLOW, principal=ALICE, pattern=LITERAL,
      rtype=TOPIC, host="*") -> AclBinding:
    return AclBinding(rtype, name, pattern, principal, host, op, permission)


def image_with(*bindings: AclBinding) -> MetadataImage:
    image = MetadataImage()
    for offset, binding in enumerate(bindings):
        image.apply(AccessControlEntryRecord(*binding), offset)
    return image


def authorizer(*bindings, allow_if_no_acls=False, super_users=(), ready=lambda: True):
    image = image_with(*bindings)
    return Authorizer(lambda: image, AclSettings(True, frozenset(super_users),
                                                 allow_if_no_acls), ready), image


def allowed(auth, op=READ, name="orders", principal=ALICE, rtype=TOPIC, host=HOST) -> bool:
    return auth.authorize(principal, host, op, rtype, name)


def test_an_allow_allows_only_its_principal_operation_and_resource():
    auth, _ = authorizer(b())
    assert allowed(auth)
    assert not allowed(auth, principal=BOB)
    assert not allowed(auth, op=WRITE)
    assert not allowed(auth, name="payments")
    assert not allowed(auth, rtype=GROUP)


def test_deny_wins_over_any_allow():
    auth, _ = authorizer(b(principal="User:*"), b(permission=DENY, principal=BOB),
                         b(name="*", op=ALL))
    assert allowed(auth) and not allowed(auth, principal=BOB)


def test_read_write_delete_alter_imply_describe_for_an_allow_only():
    for op in (READ, WRITE, acl.DELETE, ALTER):
        assert allowed(authorizer(b(op=op))[0], op=DESCRIBE)
    assert allowed(authorizer(b(op=ALTER_CONFIGS))[0], op=DESCRIBE_CONFIGS)
    # A DENY READ does not deny DESCRIBE, which an ALLOW ALL gives.
    auth, _ = authorizer(b(op=ALL), b(op=READ, permission=DENY))
    assert allowed(auth, op=DESCRIBE) and not allowed(auth, op=READ)


def test_wildcards_prefixes_and_hosts():
    auth, _ = authorizer(b(name="*", principal="User:*", op=DESCRIBE),
                         b(name="orders.", pattern=PREFIXED, op=WRITE),
                         b(name="ord", op=READ), b(name="audit", host="10.0.0.9"))
    assert allowed(auth, op=DESCRIBE, name="anything", principal=BOB)
    assert allowed(auth, op=WRITE, name="orders.eu")
    assert not allowed(auth, op=WRITE, name="orders")  # the prefix is "orders."
    assert not allowed(auth, op=READ, name="orders")  # a literal is not a prefix
    assert not allowed(auth, name="audit") and allowed(auth, name="audit", host="10.0.0.9")


def test_allow_everyone_if_no_acl_found_only_where_no_acl_names_the_resource():
    auth, _ = authorizer(b(name="orders", principal=BOB), allow_if_no_acls=True)
    assert allowed(auth, name="payments")  # nothing names it
    assert not allowed(auth, name="orders")  # an ACL names it, for someone else
    assert not allowed(authorizer(b(principal=BOB))[0], name="payments")  # default: closed


def test_super_users_skip_acls_and_others_wait_for_the_metadata():
    ready = [False]
    auth, _ = authorizer(b(permission=DENY, principal="User:admin"),
                         super_users=("User:admin",), ready=lambda: ready[0])
    assert allowed(auth, principal="User:admin")
    with pytest.raises(BrokerNotAvailableError):
        allowed(auth)
    ready[0] = True
    assert not allowed(auth)


def test_the_cache_follows_acl_changes():
    auth, image = authorizer(b(principal=BOB))
    assert not allowed(auth)
    image.apply(AccessControlEntryRecord(*b()), image.offset + 1)
    assert allowed(auth)
    image.apply(RemoveAccessControlEntryRecord(*b()), image.offset + 1)
    assert not allowed(auth)


def test_a_replaced_image_is_read_afresh_whatever_its_acl_version():
    first = image_with(b(principal=BOB))
    second = image_with(b())  # another image, the same acl_version
    assert first.acl_version == second.acl_version
    current = [first]
    auth = Authorizer(lambda: current[0], AclSettings(True))
    assert not allowed(auth)
    current[0] = second  # a snapshot loaded, say
    assert allowed(auth)
    copy = second.copy()  # shares the set until one changes it
    current[0] = copy
    assert allowed(auth)
    second.apply(RemoveAccessControlEntryRecord(*b()), second.offset + 1)
    assert allowed(auth) and b() not in second.acls  # the copy kept its own


def test_require_raises_the_resource_types_error_saying_how_to_allow_it():
    auth, _ = authorizer(b(principal=BOB))
    with pytest.raises(TopicAuthorizationFailedError, match="acls add --allow-principal "
                       "User:alice --operation WRITE --topic orders"):
        auth.require(ALICE, HOST, WRITE, TOPIC, "orders")


def test_authorize_any_is_kafkas_authorize_by_resource_type():
    def any_write(*bindings):
        return authorizer(*bindings)[0].authorize_any(ALICE, HOST, WRITE, TOPIC)
    assert any_write(b(op=WRITE))
    assert not any_write(b(op=READ))
    assert not any_write(b(op=WRITE), b(op=WRITE, permission=DENY))
    assert not any_write(b(op=WRITE, name="orders.eu"),
                         b(op=WRITE, name="orders.", pattern=PREFIXED, permission=DENY))
    assert any_write(b(op=WRITE, name="orders.eu"), b(op=WRITE, name="x", permission=DENY))
    assert not any_write(b(op=WRITE), b(name="*", op=WRITE, permission=DENY))
    assert any_write(b(name="*", op=WRITE), b(op=WRITE, permission=DENY))


# -- the index and cache agree with the rules read plainly ---------------------------------
names = st.sampled_from(["orders", "orders.eu", "ord", "payments", "*", "p"])
bindings = st.builds(
    AclBinding, st.sampled_from([TOPIC, GROUP]), names, st.sampled_from([LITERAL, PREFIXED]),
    st.sampled_from([ALICE, BOB, "User:*"]), st.sampled_from(["*", HOST, "10.0.0.2"]),
    st.sampled_from([READ, WRITE, DESCRIBE, ALL, acl.DELETE]), st.sampled_from([ALLOW, DENY]))


def plain_decision(acls, principal, host, op, rtype, name, allow_if_no_acls) -> bool:
    """The rules as Kafka's documentation states them, over a list."""
    def names_it(x):
        return x.resource_type == rtype and acl.pattern_applies(
            x.pattern_type, x.resource_name, name)
    relevant = [x for x in acls if names_it(x)]
    if not relevant:
        return allow_if_no_acls
    mine = [x for x in relevant if x.principal in (principal, "User:*")
            and x.host in (host, "*")]
    if any(x.permission_type == DENY and x.operation in (op, ALL) for x in mine):
        return False
    return any(x.permission_type == ALLOW and (
        x.operation in (op, ALL) or x.operation in acl.IMPLIED_BY.get(op, ())) for x in mine)


@settings(max_examples=300, deadline=None)
@given(st.sets(bindings.filter(lambda x: x.operation in acl.SUPPORTED_OPERATIONS[
    x.resource_type]), max_size=25), st.booleans(),
       st.sampled_from([ALICE, BOB, "User:carol"]), st.sampled_from([HOST, "10.0.0.2"]),
       st.sampled_from([READ, WRITE, DESCRIBE, acl.DELETE]), st.sampled_from([TOPIC, GROUP]),
       st.sampled_from(["orders", "orders.eu", "ord", "payments", "pay", "x"]))
def test_decisions_agree_with_a_plain_reading_of_the_rules(acls, open_, principal, host, op,
                                                         rtype, name):
    if op not in acl.SUPPORTED_OPERATIONS[rtype]:
        return
    auth, _ = authorizer(*acls, allow_if_no_acls=open_)
    expected = plain_decision(acls, principal, host, op, rtype, name, open_)
    assert auth.authorize(principal, host, op, rtype, name) == expected
    assert auth.authorize(principal, host, op, rtype, name) == expected  # cached
    assert decide(AclIndex(acls), principal, host, op, rtype, name, open_) == expected


# -- the model, the records, the image and the controller -----------------------------------
@pytest.mark.parametrize("bad", [
    b(pattern="MATCH"), b(name=""), b(rtype=CLUSTER, name="other", op=ALTER),
    b(rtype=GROUP, op=WRITE), b(principal="alice"), b(principal="User:"),
    b(host="example.com"), b(op="FLY"), b(permission="MAYBE"), b(rtype="BROKER"),
])
def test_bindings_kafka_would_not_store_are_refused(bad):
    with pytest.raises(InvalidRequestError):
        acl.check_binding(bad)
    with pytest.raises(MetadataApplyError):
        MetadataImage().apply(AccessControlEntryRecord(*bad), 0)


def test_filters_match_as_kafkas_do():
    literal, prefixed, wildcard = b(), b(name="ord", pattern=PREFIXED), b(name="*")
    match = AclBindingFilter(TOPIC, "orders", acl.MATCH)
    assert [acl.filter_matches(match, x) for x in (literal, prefixed, wildcard)] == [
        True, True, True]
    exact = AclBindingFilter(TOPIC, "orders", acl.ANY)
    assert [acl.filter_matches(exact, x) for x in (literal, prefixed, wildcard)] == [
        True, False, False]
    assert acl.filter_matches(AclBindingFilter(), literal)
    assert not acl.filter_matches(AclBindingFilter(principal=BOB), literal)


def test_acls_survive_a_snapshot_and_copies_do_not_share_changes():
    image = image_with(b(), b(name="orders.", pattern=PREFIXED, op=WRITE))
    assert MetadataImage.from_snapshot(image.to_snapshot()).acls == image.acls
    copy = image.copy()
    copy.apply(AccessControlEntryRecord(*b(op=WRITE)), copy.offset + 1)
    assert b(op=WRITE) in copy.acls and b(op=WRITE) not in image.acls
    image.apply(RemoveAccessControlEntryRecord(*b()), image.offset + 1)
    assert b() in copy.acls and b() not in image.acls
    with pytest.raises(MetadataApplyError):  # twice: the controller never writes that
        image.apply(RemoveAccessControlEntryRecord(*b()), image.offset + 1)
    record = AccessControlEntryRecord(*b())
    assert decode(record.encode()) == record


def test_the_controller_creates_acls_once_and_deletes_what_filters_match():
    controller = Controller(ControllerSettings())
    image = MetadataImage()
    result = controller.create_acls(image, {"creations": [
        b().to_wire(), b().to_wire(), b(op=WRITE).to_wire(), {"resource_type": TOPIC}]})
    assert [r["error"] for r in result.response["results"]][:3] == [None, None, None]
    assert result.response["results"][3]["error"]["code"] == "INVALID_REQUEST"
    assert len(result.records) == 2  # the same binding twice is one
    for offset, record in enumerate(result.records):
        image.apply(record, offset)
    again = controller.create_acls(image, {"creations": [b().to_wire()]})
    assert again.records == [] and again.response["results"] == [{"error": None}]
    deleted = controller.delete_acls(image, {"filters": [
        {"operation": WRITE}, {"resource_type": TOPIC}, {"pattern_type": "SOMETIMES"}]})
    answers = deleted.response["filter_results"]
    assert [len(a["matching_acls"]) for a in answers] == [1, 2, 0]
    assert answers[2]["error"]["code"] == "INVALID_REQUEST"
    assert len(deleted.records) == 2  # each once, though two filters matched one
    assert controller.create_acls(image, {"creations": [
        b(rtype=CLUSTER, name=CLUSTER_NAME, op=ALTER).to_wire()]}).response["results"] == [
            {"error": None}]
