"""A short fuzz campaign against a real cluster (``kraftlog chaos fuzz``):
the kept corpus first, then seeded random inputs to every broker and
controller endpoint; nothing may crash, hang or answer 500, and the
cluster must still take and serve acks=all writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from chaos.cluster import REPO_ROOT

CORPUS = os.path.join(REPO_ROOT, "tests", "fuzz_corpus", "corpus.jsonl")


def test_a_fuzz_campaign_finds_nothing_and_leaves_the_cluster_whole(tmp_path):
    with open(CORPUS, encoding="utf-8") as f:
        kept = sum(1 for line in f if line.strip())
    assert kept >= 100, "the kept corpus is missing or nearly empty"
    result = subprocess.run(
        [sys.executable, "-m", "api.cli", "chaos", "fuzz", "--duration", "20", "--brokers", "2",
         "--seed", "5", "--corpus", CORPUS, "--out", str(tmp_path), "--json"],
        capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads(result.stdout)
    assert summary["findings_count"] == 0 and summary["cluster_ok"], summary
    assert summary["corpus_inputs"] == kept
    assert summary["routes_reached"] == summary["routes"] >= 80
    assert summary["requests"] > kept + 200
    assert summary["outcomes"] >= 150, "the inputs no longer reach past the first checks"
