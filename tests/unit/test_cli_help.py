"""Every option and argument of every command says what it is for in --help."""

from __future__ import annotations

import argparse

from api import cli


def undescribed(parser: argparse.ArgumentParser, path: list[str]) -> list[str]:
    missing = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                missing += undescribed(sub, path + [name])
        elif not action.help and action.dest != "help":
            missing.append(" ".join(path + [action.option_strings[0] if action.option_strings
                                            else action.dest]))
    return missing


def test_every_argument_of_every_command_has_a_description():
    for command in (None, "bench", "chaos"):  # bench and chaos are built on demand
        assert undescribed(cli.build_parser(command), ["kraftlog"]) == []


def test_the_check_finds_an_undescribed_flag():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quiet-flag")
    assert undescribed(parser, ["x"]) == ["x --quiet-flag"]


def test_bootstrap_takes_kafkas_host_port_and_urls():
    assert cli.normalise_bootstrap("127.0.0.1:9092") == "http://127.0.0.1:9092"
    assert cli.normalise_bootstrap("a:1, https://b:2") == "http://a:1,https://b:2"
