"""The node config schema: every key declared once, read by someone, checked
on load; unknown keys refused with a suggestion; docs/config.md from it."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys
import tomllib

import pytest

from kraft.config import load_node_config, node_config_from_settings, print_config
from kraft.config_schema import BY_NAME, SCHEMA, Key, render_markdown
from protocol.errors import InvalidConfigError

ROOT = pathlib.Path(__file__).resolve().parents[2]
MINIMAL = {"node.id": 1, "process.roles": "broker",
           "controller.quorum.voters": "9@127.0.0.1:1", "listeners": "BROKER://127.0.0.1:2",
           "log.dirs": "/tmp/unused"}


def string_constants(module: str) -> set[str]:
    tree = ast.parse((ROOT / module).read_text(encoding="utf-8"))
    return {node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)}


def unread(keys) -> list[str]:
    """Keys whose ``read_by`` module never names them."""
    cache: dict[str, set[str]] = {}
    return [key.name for key in keys
            if key.name not in cache.setdefault(key.read_by, string_constants(key.read_by))]


def test_every_key_is_read_by_the_module_it_names():
    assert unread(SCHEMA) == []


def test_a_key_nobody_reads_is_caught():
    ghost = Key("group.initial.rebalance.delay.ms", "int", 3000, "unused", "kraft/config.py")
    assert unread([ghost]) == ["group.initial.rebalance.delay.ms"]


def test_docs_config_md_is_rendered_from_the_schema():
    assert (ROOT / "docs" / "config.md").read_text(encoding="utf-8") == render_markdown(), (
        "regenerate it: python -c \"from kraft.config_schema import render_markdown; "
        "open('docs/config.md','w').write(render_markdown())\"")


def test_every_shipped_config_uses_only_known_keys_and_loads():
    for path in sorted((ROOT / "configs").rglob("*.toml")):
        with open(path, "rb") as f:
            keys = set(tomllib.load(f))
        assert keys <= set(BY_NAME), f"{path}: {sorted(keys - set(BY_NAME))}"
        if "node.id" in keys:  # chaos.toml is a base the harness completes per node
            load_node_config(str(path))


def test_an_unknown_key_names_the_nearest_one(tmp_path):
    path = tmp_path / "node.toml"
    path.write_text('"node.id" = 1\n"log.retention.hour" = 5\n')
    with pytest.raises(InvalidConfigError, match=r"unknown config key 'log.retention.hour' in "
                       r".*node.toml; did you mean 'log.retention.hours'\?"):
        load_node_config(str(path))
    with pytest.raises(InvalidConfigError, match="'num.replica.fetcher' in --set; did you "
                       "mean 'num.replica.fetchers'"):
        load_node_config(str(ROOT / "configs" / "single-node.toml"),
                         ["num.replica.fetcher=2"])


def test_a_key_no_component_reads_is_unknown():
    with pytest.raises(InvalidConfigError, match="group.initial.rebalance.delay.ms"):
        node_config_from_settings({**MINIMAL, "group.initial.rebalance.delay.ms": 0})


@pytest.mark.parametrize("key, value, message", [
    ("num.replica.fetchers", 0, r"num.replica.fetchers = 0 is outside \[1, 64\]"),
    ("replica.fetch.wait.max.ms", "soon", "must be an integer"),
    ("unclean.leader.election.enable", "maybe", "must be true or false"),
    ("broker.rack", 3, "must be a string"),
])
def test_values_are_checked_against_the_schema(key, value, message):
    with pytest.raises(InvalidConfigError, match=message):
        node_config_from_settings({**MINIMAL, key: value})


@pytest.mark.parametrize("value, typed", [
    (0.25, 0.25), (0, 0.0), (1, 1.0), ("0.75", 0.75), ("1e-1", 0.1), (-0.0, 0.0)])
def test_a_float_key_takes_numbers_as_floats(value, typed):
    config = node_config_from_settings({**MINIMAL, "log.cleaner.min.cleanable.ratio": value})
    got = config.settings["log.cleaner.min.cleanable.ratio"]
    assert got == typed and type(got) is float and str(got) != "-0.0"


@pytest.mark.parametrize("value, message", [
    (1.5, r"log.cleaner.min.cleanable.ratio = 1.5 is outside \[0, 1\]"),
    (-0.5, r"log.cleaner.min.cleanable.ratio = -0.5 is outside \[0, 1\]"),
    ("2", r"= 2.0 is outside \[0, 1\]"),
    (True, "must be a number, got True"),
    ("half", "must be a number, got 'half'"),
    (float("nan"), "must be a finite number, got nan"),
    ("inf", "must be a finite number, got 'inf'"),
    (10**400, "must be a finite number, got an integer too large"),
    ([0.5], "must be a number"),
])
def test_a_float_key_refuses_what_is_not_a_finite_number_in_range(value, message):
    with pytest.raises(InvalidConfigError, match=message):
        node_config_from_settings({**MINIMAL, "log.cleaner.min.cleanable.ratio": value})


def test_compaction_keys_are_declared_with_the_logs_defaults_and_kafkas_ranges():
    config = node_config_from_settings(MINIMAL)
    assert {key: config.settings[key] for key in (
        "log.cleanup.policy", "log.cleaner.min.cleanable.ratio",
        "log.cleaner.min.compaction.lag.ms", "log.cleaner.max.compaction.lag.ms",
        "log.cleaner.delete.retention.ms")} == {
        "log.cleanup.policy": "delete", "log.cleaner.min.cleanable.ratio": 0.5,
        "log.cleaner.min.compaction.lag.ms": 0,
        "log.cleaner.max.compaction.lag.ms": 2**63 - 1,
        "log.cleaner.delete.retention.ms": 86_400_000}
    ratio = BY_NAME["log.cleaner.min.cleanable.ratio"]
    assert (ratio.type, ratio.describe_range()) == ("float", "[0, 1]")
    assert BY_NAME["log.cleaner.max.compaction.lag.ms"].describe_range() == (
        f"[1, {2**63 - 1}]")
    for name in ("log.cleaner.min.compaction.lag.ms", "log.cleaner.delete.retention.ms"):
        assert BY_NAME[name].min == 0
    assert "| `log.cleaner.min.cleanable.ratio` | float | `0.5` | [0, 1] |" in render_markdown()


@pytest.mark.parametrize("settings, message", [
    ({"log.cleanup.policy": "shred"}, "log.cleanup.policy = 'shred' is invalid: it must be "
                                      "delete, compact or compact,delete"),
    ({"log.cleaner.min.compaction.lag.ms": 10, "log.cleaner.max.compaction.lag.ms": 9},
     r"max.compaction.lag.ms = 9 is invalid: it must be at least min.compaction.lag.ms "
     r"\(10\)"),
])
def test_log_settings_that_make_a_bad_topic_default_stop_the_node_at_load(settings, message):
    with pytest.raises(InvalidConfigError, match=message):
        node_config_from_settings({**MINIMAL, **settings})


def test_log_cleanup_policy_is_taken_in_any_kafka_spelling():
    config = load_node_config(str(ROOT / "configs" / "single-node.toml"),
                              ["log.cleanup.policy=Delete,Compact",
                               "log.cleaner.min.cleanable.ratio=0.1"])
    assert config.settings["log.cleanup.policy"] == "Delete,Compact"  # as given
    assert config.settings["log.cleaner.min.cleanable.ratio"] == 0.1


def test_values_reach_components_typed_with_defaults_filled():
    config = node_config_from_settings({**MINIMAL, "replica.fetch.max.bytes": "2048"})
    assert config.settings["replica.fetch.max.bytes"] == 2048
    assert config.settings["num.replica.fetchers"] == 1
    assert "log.retention.ms" not in config.settings, "unset: the log's own default applies"


def test_print_config_shows_every_key_and_where_it_came_from(tmp_path):
    config = load_node_config(str(ROOT / "configs" / "single-node.toml"),
                              ["num.replica.fetchers=3"])
    table = print_config(config).splitlines()
    assert table[0].split() == ["KEY", "VALUE", "FROM"]
    assert len(table) == len(SCHEMA) + 1
    rows = {line.split()[0]: line.split()[1:] for line in table[1:]}
    assert rows["num.replica.fetchers"] == ["3", "--set"]
    assert rows["node.id"][1].endswith("single-node.toml")
    assert rows["replica.lag.time.max.ms"] == ["30000", "default"]


def test_kraftlog_node_print_config_and_a_bad_key_from_the_command_line():
    shown = subprocess.run([sys.executable, "-m", "api.cli", "node", "--config",
                            "configs/single-node.toml", "--print-config"], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "replica.fetch.wait.max.ms" in shown.stdout and "default" in shown.stdout
    bad = subprocess.run([sys.executable, "-m", "api.cli", "node", "--config",
                          "configs/single-node.toml", "--set", "log.segment.byte=1"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2
    assert "did you mean 'log.segment.bytes'" in bad.stderr and "Traceback" not in bad.stderr


def test_a_setting_given_as_none_is_unset_and_no_text_may_hold_a_nul():
    """Two things tests/property/test_fuzz_inputs.py found: a value of None
    (possible from Python, not TOML) crashed the checks instead of meaning
    "not set", and a path with a NUL character crashed the file read."""
    config = node_config_from_settings({**MINIMAL, "broker.session.timeout.ms": None})
    assert config.session_timeout_ms == 9000
    for key, value in (("controller.quorum.secret.file", "/tmp/a\x00b"),
                       ("log.dirs", ["/tmp/d", "/tmp/\x00"]), ("broker.rack", "r\x00")):
        with pytest.raises(InvalidConfigError, match=f"{key} must not contain a NUL"):
            node_config_from_settings({**MINIMAL, key: value})
