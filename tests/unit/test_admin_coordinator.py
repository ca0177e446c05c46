"""AsyncAdmin's group coordinator calls retry what a retry can cure: a
coordinator that moved, and an offsets log short of in-sync replicas while
a broker is down (the exactly-once Spark sink commits through this)."""

from __future__ import annotations

import pytest

from api.client import AsyncAdmin, KraftlogError
from api.client.errors import error_from


class Coordinator:
    """Answers the coordinator lookup, then fails the offsets write with
    ``failures`` in turn before taking it."""

    def __init__(self, failures):
        self.failures = list(failures)
        self.writes = 0

    async def call(self, path, body=None, **_):
        assert path == "/v1/groups/coordinator"
        return {"coordinator_url": "http://c:1"}

    async def request(self, url, path, body=None, **_):
        assert (url, path) == ("http://c:1", "/v1/admin/groups/offsets/reset")
        self.writes += 1
        if self.failures:
            code = self.failures.pop(0)
            raise error_from({"error": {"code": code, "message": "not now"}})
        return {}


def admin_with(coordinator, **settings):
    admin = AsyncAdmin("http://a:1", retry_backoff_ms=1, **settings)
    admin._call = coordinator.call
    admin._transport.request = coordinator.request
    return admin


@pytest.mark.parametrize("code", ["NOT_ENOUGH_REPLICAS", "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
                                  "NOT_COORDINATOR", "COORDINATOR_LOAD_IN_PROGRESS"])
async def test_an_offsets_write_is_retried_until_it_takes(code):
    coordinator = Coordinator([code, code])
    admin = admin_with(coordinator)
    try:
        await admin.alter_consumer_group_offsets("g", {("t", 0): 5})
    finally:
        await admin.close()
    assert coordinator.writes == 3


async def test_other_errors_are_not_retried():
    coordinator = Coordinator(["GROUP_ID_NOT_FOUND"])
    admin = admin_with(coordinator)
    try:
        with pytest.raises(KraftlogError) as raised:
            await admin.alter_consumer_group_offsets("g", {("t", 0): 5})
    finally:
        await admin.close()
    assert raised.value.code == "GROUP_ID_NOT_FOUND" and coordinator.writes == 1
