"""The controller quorum's voter set as the replicated log records it
(KIP-853's dynamic quorum, on pysyncobj's membership entries).

What a voter set is. Every controller that votes, by node id: its Raft
address (pysyncobj's ``host:port``) and the URL of its ``CONTROLLER``
listener (the HTTP API brokers and the CLI call). The static
``controller.quorum.voters`` is only where a cluster starts: once the log
holds membership entries, the log wins.

Where it lives. A change is one Raft entry of pysyncobj's MEMBERSHIP type,
whose payload is pysyncobj's own request (``[kind, address, address]``, so
its handler moves the Raft connections) followed by the voter's id and URL.
Raft needs each server to use the latest voter set in its log, committed or
not (the dissertation's single-server changes; KIP-853 does the same):

- ``replay`` gives the set after a run of entries (start-up: the snapshot's
  set, then the journal after it; a follower appending entries);
- ``revert`` undoes a run of entries (the set a snapshot must record, as of
  its last entry, while later entries are already in the log).

Both are pure functions of their arguments, tested on their own
(``tests/unit/test_membership.py``). ``check_add`` and ``check_remove`` say
why a change is refused, before it is proposed and again on the Raft tick
thread right before the leader appends it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pysyncobj.pickle as _pysyncobj_pickle

#: pysyncobj's command type byte for membership entries (``_COMMAND_TYPE.MEMBERSHIP``).
MEMBERSHIP_COMMAND_TYPE = 2
ADD, REMOVE = "add", "rem"  # pysyncobj's request kinds


@dataclass(frozen=True)
class Voter:
    """One voting controller."""

    node_id: int
    raft_address: str      # "host:port" of its Raft (pysyncobj) listener
    url: str | None        # its CONTROLLER listener, "http(s)://host:port"; None: unknown

    def as_list(self) -> list:
        return [self.node_id, self.raft_address, self.url]

    @classmethod
    def from_list(cls, raw: Any) -> "Voter":
        node_id, raft_address, url = raw
        if not isinstance(node_id, int) or not isinstance(raft_address, str) \
                or not (url is None or isinstance(url, str)):
            raise ValueError(f"not a voter: {raw!r}")
        return cls(node_id, raft_address, url)


Voters = Mapping[int, Voter]


@dataclass(frozen=True)
class Change:
    """One membership entry: ``kind`` (ADD or REMOVE) of ``voter``."""

    kind: str
    voter: Voter

    def request(self) -> list:
        """pysyncobj's request, with the voter appended (pysyncobj reads
        only the first three items)."""
        address = self.voter.raft_address
        return [self.kind, address, address, self.voter.as_list()]

    def command(self) -> bytes:
        """The payload pysyncobj's ``_applyCommand`` takes (without its type byte)."""
        return _pysyncobj_pickle.dumps(self.request())


def parse_request(request: Any) -> Change | None:
    """The change in a pysyncobj membership request; None when it is not
    one of ours (pysyncobj's own ``addNodeToCluster`` carries no voter)."""
    if not isinstance(request, (list, tuple)) or len(request) < 4:
        return None
    kind = request[0]
    if kind not in (ADD, REMOVE):
        return None
    try:
        voter = Voter.from_list(request[3])
    except (TypeError, ValueError):
        return None
    if voter.raft_address != request[1]:
        return None
    return Change(kind, voter)


def parse_entry(command: bytes) -> Change | None:
    """The change a journal entry's command holds, or None for any other
    entry (regular commands, no-ops, version changes)."""
    if not command or command[0] != MEMBERSHIP_COMMAND_TYPE:
        return None
    try:
        request = _pysyncobj_pickle.loads(bytes(command[1:]))
    except Exception:  # noqa: BLE001 - an entry that does not unpickle changes nothing
        return None
    return parse_request(request)


def apply_change(voters: Voters, change: Change, reverse: bool = False) -> dict[int, Voter]:
    """The voter set after ``change`` (before it, with ``reverse``)."""
    out = dict(voters)
    adding = (change.kind == ADD) != reverse
    if adding:
        out[change.voter.node_id] = change.voter
    else:
        out.pop(change.voter.node_id, None)
    return out


def replay(voters: Voters, commands: Iterable[bytes]) -> dict[int, Voter]:
    """The voter set after the journal entries' ``commands``, in order."""
    out = dict(voters)
    for command in commands:
        change = parse_entry(command)
        if change is not None:
            out = apply_change(out, change)
    return out


def revert(voters: Voters, commands: Iterable[bytes]) -> dict[int, Voter]:
    """The voter set before the entries' ``commands`` (given oldest first)."""
    out = dict(voters)
    for command in reversed(list(commands)):
        change = parse_entry(command)
        if change is not None:
            out = apply_change(out, change, reverse=True)
    return out


def encode_voters(voters: Voters) -> list:
    """For a snapshot: the voters as plain lists, by id."""
    return [voters[node_id].as_list() for node_id in sorted(voters)]


def decode_voters(raw: Any) -> dict[int, Voter]:
    voters = {}
    for item in raw:
        voter = Voter.from_list(item)
        voters[voter.node_id] = voter
    return voters


# -- validation (pure) ------------------------------------------------------

class MembershipRefused(Exception):
    """A change that must not be made, with the code to answer (Kafka's
    names: DUPLICATE_VOTER, VOTER_NOT_FOUND; INVALID_REQUEST;
    REBALANCE_IN_PROGRESS for a change while another is not committed)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


DUPLICATE_VOTER = "DUPLICATE_VOTER"
VOTER_NOT_FOUND = "VOTER_NOT_FOUND"
INVALID_REQUEST = "INVALID_REQUEST"
CHANGE_IN_PROGRESS = "REBALANCE_IN_PROGRESS"


def parse_host_port(text: Any, what: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` for IPv6) or MembershipRefused naming ``what``."""
    if not isinstance(text, str) or not text or len(text) > 300 or text != text.strip():
        raise MembershipRefused(INVALID_REQUEST, f"{what} must be host:port, not {text!r}")
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            host = ""
    if not sep or not host or not port.isascii() or not port.isdigit() \
            or not 1 <= int(port) <= 65535 or any(c in host for c in "/@ \t,"):
        raise MembershipRefused(INVALID_REQUEST,
                                f"{what} must be host:port with a port from 1 to 65535, "
                                f"not {text!r}")
    return host, int(port)


def check_add(voters: Voters, voter: Voter) -> None:
    """Raise MembershipRefused unless ``voter`` may join ``voters``."""
    if voter.node_id in voters:
        held = voters[voter.node_id]
        raise MembershipRefused(
            DUPLICATE_VOTER, f"controller {voter.node_id} is already a voter (Raft address "
            f"{held.raft_address}); to move it to another address, remove it first")
    for other in voters.values():
        if other.raft_address == voter.raft_address:
            raise MembershipRefused(
                DUPLICATE_VOTER, f"the Raft address {voter.raft_address} is already voter "
                f"{other.node_id}'s")
        if voter.url is not None and other.url == voter.url:
            raise MembershipRefused(
                DUPLICATE_VOTER, f"the address {voter.url} is already voter {other.node_id}'s")


def stale_state_message(node_id: int) -> str:
    """Why a controller cannot be added back as it is: its metadata dir
    still holds the voter set (and term) from before it was removed."""
    return (f"controller {node_id} holds stale state: its log (or, with an empty log, its "
            "controller.quorum.voters) still makes it a voter (it was removed while it was "
            "down?). Stop it, remove its metadata dir (metadata.log.dir), set its "
            "controller.quorum.voters to the current voters (not naming it) and "
            "controller.quorum.join = true, start it again, and retry. Nothing was changed")


def check_remove(voters: Voters, node_id: int) -> Voter:
    """The voter to remove, or MembershipRefused."""
    if node_id not in voters:
        raise MembershipRefused(
            VOTER_NOT_FOUND, f"controller {node_id} is not a voter (voters: "
            f"{', '.join(str(n) for n in sorted(voters))})")
    if len(voters) == 1:
        raise MembershipRefused(
            INVALID_REQUEST, f"controller {node_id} is the last voter: a quorum needs one; "
            "add another controller first")
    return voters[node_id]
