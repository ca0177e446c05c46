"""How the suite shares this machine's two cores (``make test`` runs
``pytest -n 2 --dist loadfile``: two pytest-xdist workers).

Each test file runs whole on one worker, so a module's cluster is started
once. The chaos scenarios and the Spark tests together make one more unit,
handed out first, and run one after the other on one worker: each loads
the machine by itself (three clusters under faults at once; a JVM and its
Python workers beside a cluster, one SparkSession for all its tests), and
the two at once starved Spark's Python workers past its timeouts. The other
worker takes the other files meanwhile. Every test starts its servers on
ephemeral ports and keeps its files under its own temporary directory, so
two tests at once never meet.
"""

from __future__ import annotations

import pytest

#: Directories under tests/ whose files make one unit, run in this order first.
HEAVY_DIRECTORIES = ("chaos", "spark")
HEAVY_UNIT = "tests/chaos+spark"


def _directory_unit(nodeid: str) -> str | None:
    parts = nodeid.split("/", 2)
    if len(parts) == 3 and parts[0] == "tests" and parts[1] in HEAVY_DIRECTORIES:
        return parts[1]
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The heavy directories' tests first (a stable sort keeps every other
    order): the longest unit starts before the rest, not at the end."""
    rank = {name: i for i, name in enumerate(HEAVY_DIRECTORIES)}
    items.sort(key=lambda item: rank.get(_directory_unit(item.nodeid) or "", len(rank)))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadfile``, with the heavy directories one unit."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FilesAndOneHeavyUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return HEAVY_UNIT if _directory_unit(nodeid) else nodeid.split("::", 1)[0]

    config.option.loadscopereorder = False  # the collection's order: the heavy unit first
    return FilesAndOneHeavyUnit(config, log)
