"""``kraftlog chaos scenarios`` and ``kraftlog chaos check``: what people see,
and exit statuses scripts can rely on (0 pass, 1 fail)."""

from __future__ import annotations

import json

import pytest

from api.cli import main
from chaos import nemesis
from tests.unit.test_chaos_checker import clean_history, drain


def write_history(directory, events) -> None:
    with open(directory / "history.jsonl", "w") as f:
        for event in events:
            f.write(json.dumps(event) + "\n")


def test_scenarios_lists_every_scenario_with_what_it_proves(capsys):
    assert main(["chaos", "scenarios"]) == 0
    out = capsys.readouterr().out
    for scenario in nemesis.SCENARIOS.values():
        assert scenario.name in out
    assert "Proves" in out and "Namespaces" in out


def test_check_passes_a_clean_history_and_rewrites_results(tmp_path, capsys):
    write_history(tmp_path, clean_history())
    assert main(["chaos", "check", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith("PASS")
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["verdict"] == "pass" and results["counts"]["ok"] == 5
    assert "<svg" in (tmp_path / "report.html").read_text()


def test_check_fails_a_history_with_a_lost_write(tmp_path, capsys):
    events = [e for e in clean_history() if e["type"] not in ("drain", "poll")]
    events.append(drain(0, [(0, "0-0")]))
    write_history(tmp_path, events)
    assert main(["chaos", "check", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("FAIL") and "4 lost" in out


def test_check_of_a_directory_without_a_history_says_what_to_give(tmp_path, capsys):
    assert main(["chaos", "check", str(tmp_path)]) == 1
    assert "give the --out directory of a chaos run" in capsys.readouterr().err


def test_run_refuses_to_overwrite_a_previous_run(tmp_path, capsys):
    write_history(tmp_path, clean_history())
    assert main(["chaos", "run", "--scenario", "kill-leader", "--out", str(tmp_path)]) == 1
    assert "already holds a run" in capsys.readouterr().err


def test_run_rejects_an_unknown_scenario(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["chaos", "run", "--scenario", "kill-everything"])
    assert exit_info.value.code == 2
    assert "kill-everything" in capsys.readouterr().err
