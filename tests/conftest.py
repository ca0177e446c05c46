"""How the suite shares this machine's two cores (``make test`` runs
``pytest -n 2 --dist loadfile``: two pytest-xdist workers).

Each test file runs whole on one worker, so a module's cluster is started
once. The chaos scenarios and the Spark tests are each one unit as well:
each set loads the machine by itself (three clusters under faults at once;
a JVM and its Python workers beside a cluster, with one SparkSession for
all its tests), so a set never runs on both workers at once. They are
handed out first, one to each worker; the other files follow as the workers
come free. Every test starts its servers on ephemeral ports and keeps its
files under its own temporary directory, so two tests at once never meet.
"""

from __future__ import annotations

import pytest

#: Directories under tests/ whose files make one unit each, handed out first.
WHOLE_DIRECTORIES = ("chaos", "spark")


def _directory_unit(nodeid: str) -> str | None:
    parts = nodeid.split("/", 2)
    if len(parts) == 3 and parts[0] == "tests" and parts[1] in WHOLE_DIRECTORIES:
        return parts[1]
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The whole directories' tests first (a stable sort keeps every other
    order): the longest units start before the rest, not at the end."""
    rank = {name: i for i, name in enumerate(WHOLE_DIRECTORIES)}
    items.sort(key=lambda item: rank.get(_directory_unit(item.nodeid) or "", len(rank)))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadfile``, with each whole directory one unit."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FilesAndWholeDirectories(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _directory_unit(nodeid) or nodeid.split("::", 1)[0]

    config.option.loadscopereorder = False  # the collection's order, whole directories first
    return FilesAndWholeDirectories(config, log)
