"""The voter set as the log records it (kraft/membership.py): entries
encode and decode, replay and revert are inverse, refusals say why."""

import pytest

from kraft import membership
from kraft.membership import ADD, REMOVE, Change, MembershipRefused, Voter

V1, V2, V3 = (Voter(n, f"10.0.0.{n}:9094", f"http://10.0.0.{n}:9093") for n in (1, 2, 3))
V4 = Voter(4, "10.0.0.4:9094", None)


def entry(change):
    return bytes([membership.MEMBERSHIP_COMMAND_TYPE]) + change.command()


def test_an_entry_decodes_to_its_change_and_others_to_none():
    change = Change(ADD, V4)
    assert membership.parse_entry(entry(change)) == change
    assert membership.parse_entry(b"\x00" + b"regular") is None
    assert membership.parse_entry(b"\x01") is None  # no-op
    assert membership.parse_entry(b"\x02not a pickle") is None
    # pysyncobj's own request (no voter) is not ours
    assert membership.parse_request(["add", V4.raft_address, V4.raft_address]) is None


def test_replay_then_revert_gives_the_set_back():
    start = {1: V1, 2: V2, 3: V3}
    entries = [entry(Change(ADD, V4)), b"\x00x", entry(Change(REMOVE, V1))]
    after = membership.replay(start, entries)
    assert after == {2: V2, 3: V3, 4: V4}
    assert membership.revert(after, entries) == start
    assert membership.revert(after, entries[2:]) == {1: V1, 2: V2, 3: V3, 4: V4}


def test_voters_round_trip_through_a_snapshot():
    voters = {1: V1, 4: V4}
    assert membership.decode_voters(membership.encode_voters(voters)) == voters


@pytest.mark.parametrize("voter, code", [
    (Voter(2, "10.0.0.9:9094", None), "DUPLICATE_VOTER"),
    (Voter(9, V2.raft_address, None), "DUPLICATE_VOTER"),
    (Voter(9, "10.0.0.9:9094", V3.url), "DUPLICATE_VOTER"),
])
def test_adding_what_is_already_there_is_refused(voter, code):
    with pytest.raises(MembershipRefused) as refused:
        membership.check_add({1: V1, 2: V2, 3: V3}, voter)
    assert refused.value.code == code


def test_removing_an_unknown_or_the_last_voter_is_refused():
    with pytest.raises(MembershipRefused) as refused:
        membership.check_remove({1: V1, 2: V2}, 7)
    assert refused.value.code == "VOTER_NOT_FOUND" and "1, 2" in str(refused.value)
    with pytest.raises(MembershipRefused) as refused:
        membership.check_remove({1: V1}, 1)
    assert refused.value.code == "INVALID_REQUEST"
    assert membership.check_remove({1: V1, 2: V2}, 2) == V2


@pytest.mark.parametrize("text", ["", "host", "host:", ":9093", "host:0", "host:70000",
                                  "host:9x", " host:1", "a/b:1", "a@b:1", 5, None,
                                  "[zz]:1", "h" * 400 + ":1"])
def test_bad_addresses_are_refused(text):
    with pytest.raises(MembershipRefused) as refused:
        membership.parse_host_port(text, "--raft-address")
    assert refused.value.code == "INVALID_REQUEST" and "--raft-address" in str(refused.value)


def test_good_addresses_parse():
    assert membership.parse_host_port("127.0.0.1:9094", "x") == ("127.0.0.1", 9094)
    assert membership.parse_host_port("[::1]:9094", "x") == ("[::1]", 9094)
    assert membership.parse_host_port("ctl-4.example:1", "x") == ("ctl-4.example", 1)
