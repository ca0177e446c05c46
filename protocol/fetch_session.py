"""Fetch sessions on the wire (Kafka's KIP-227), as followers and
consumers use them and leaders keep them: the epochs, how one follows
another, and the refusals that make the fetcher open a new session.
Shared by the broker (``api.broker.replication``) and the client
(``api.client.fetcher``)."""

from __future__ import annotations

#: Fetch session epochs: none (with a session id: closing that one, Kafka's
#: final epoch), and the one that opens a session.
NO_SESSION, OPEN_SESSION = -1, 0
#: The largest session epoch; the next one is 1 again (as Kafka wraps).
FETCH_SESSION_EPOCH_MAX = 2**31 - 1
#: A session the leader does not know, or out of step: the fetcher opens a
#: new one at once.
FETCH_SESSION_ERRORS = frozenset({"FETCH_SESSION_ID_NOT_FOUND", "INVALID_FETCH_SESSION_EPOCH"})


def next_fetch_session_epoch(epoch: int) -> int:
    """The epoch after ``epoch`` (wrapping to 1 after FETCH_SESSION_EPOCH_MAX)."""
    return 1 if epoch >= FETCH_SESSION_EPOCH_MAX else epoch + 1
