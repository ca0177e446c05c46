"""A broker's GET /v1/quorum when the quorum leader does not answer in
time: the view of the controller furthest along, not a removed
controller's, which never heard of the changes made after it left."""

from api.broker.server import _quorum_progress


def test_without_the_leader_the_view_furthest_along_speaks_for_the_quorum():
    removed_first = {"state": "observer", "term": 4, "commit_index": 120, "voters": [2, 3, 5]}
    current = {"state": "follower", "term": 5, "commit_index": 180, "voters": [3, 5]}
    lagging = {"state": "follower", "term": 5, "commit_index": 170, "voters": [3, 5]}
    malformed = {"state": "follower", "term": "5", "commit_index": None}
    views = [removed_first, lagging, malformed, current]
    assert max(views, key=_quorum_progress) is current
    assert _quorum_progress(malformed) == (-1, -1)
