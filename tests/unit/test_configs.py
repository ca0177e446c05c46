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
