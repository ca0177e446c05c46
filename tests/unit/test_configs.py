"""The shipped TOML configs parse, and their storage settings are valid."""

import pathlib
import tomllib

import pytest

from storage.config import LogConfig
from storage.manager import LogManagerConfig

CONFIGS = sorted((pathlib.Path(__file__).parents[2] / "configs").glob("*.toml"))


def test_configs_are_shipped():
    assert {p.name for p in CONFIGS} >= {"single-node.toml", "cluster-3.toml", "chaos.toml"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_storage_settings_of_each_config_are_valid(path):
    settings = tomllib.loads(path.read_text())
    log_config = LogConfig.from_broker_config(settings)
    manager_config = LogManagerConfig.from_broker_config(settings)
    assert manager_config.log_dirs
    if "log.segment.bytes" in settings:
        assert log_config.segment_bytes == settings["log.segment.bytes"]
    if "log.flush.interval.ms" in settings:
        assert log_config.flush_ms == settings["log.flush.interval.ms"]


NODE_CONFIGS = sorted(p for p in (pathlib.Path(__file__).parents[2] / "configs").rglob("*.toml")
                      if p.name != "chaos.toml")  # the chaos harness fills in identities


@pytest.mark.parametrize("path", NODE_CONFIGS, ids=lambda p: str(p.relative_to(p.parents[1])))
def test_each_shipped_node_config_is_a_valid_node(path):
    from kraft.config import load_node_config

    config = load_node_config(str(path))
    assert config.node_id >= 0 and config.roles
    if config.is_controller:
        assert config.listeners["CONTROLLER"] == config.voters[config.node_id]


def test_the_cluster_directory_is_three_controllers_and_three_brokers_on_distinct_ports():
    from kraft.config import load_node_config

    directory = pathlib.Path(__file__).parents[2] / "configs" / "cluster"
    configs = [load_node_config(str(p)) for p in sorted(directory.glob("*.toml"))]
    assert sorted(c.node_id for c in configs if c.roles == {"controller"}) == [1, 2, 3]
    assert sorted(c.node_id for c in configs if c.roles == {"broker"}) == [4, 5, 6]
    assert len({c.voters[1] for c in configs} | set()) == 1  # every file agrees on voters
    ports = [e.port for c in configs for e in c.listeners.values()]
    ports += [c.raft_endpoint(c.node_id).port for c in configs if c.is_controller]
    assert len(ports) == len(set(ports)) == 9
