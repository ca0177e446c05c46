"""`kraftlog bench storage` as a user runs it: a real process, tiny sizes.

This checks the program works end to end and reports every phase; it asserts
no speed (figures belong in BENCHMARKS.md, measured at full size)."""

import json
import os
import subprocess
import sys


def test_bench_storage_runs_every_phase_and_writes_json(tmp_path):
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [sys.executable, "-m", "api.cli", "bench", "storage", "--dir", str(tmp_path),
         "--log-mb", "4", "--small-mb", "2", "--batch-kb", "64", "--unflushed-mb", "1",
         "--lookups", "50", "--json", str(out)],
        capture_output=True, text=True, timeout=120,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert result.returncode == 0, result.stderr
    for heading in ("Writes", "Sequential reads", "Random offset lookups", "Log.open"):
        assert heading in result.stdout
    report = json.loads(out.read_text())
    assert report["writes"]["append"]["bytes"] > 0
    assert report["recovery"]["lost_offsets"] == 0
    assert report["lookups"]["big"]["count"] == 50
    # The benchmark cleans up after itself.
    assert [p.name for p in tmp_path.iterdir()] == ["bench.json"]


def test_cli_help_lists_the_commands():
    result = subprocess.run([sys.executable, "-m", "api.cli", "--help"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0
    assert "bench" in result.stdout and "--bootstrap" in result.stdout
