"""benchmarks/gemma4_synthetic.sh end to end at SIZE=tiny on the CPU: both workers, fixed acceptance."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.server

ROOT = Path(__file__).resolve().parents[1]
ACC_LEN = 3.0
MAX_NEW = 16
CONCURRENCY = [1, 8, 32]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("gemma4-synthetic")
    env = {
        **os.environ, "SIZE": "tiny", "OUT": str(out), "ACC_LEN": str(ACC_LEN),
        "CONCURRENCY": " ".join(map(str, CONCURRENCY)), "PROMPT_LEN": "16", "MAX_NEW_TOKENS": str(MAX_NEW),
    }  # fmt: skip
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gemma4_synthetic.sh")], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads((out / "results.json").read_text()), done.stdout, out


@pytest.mark.parametrize("impl", ["ours", "builtin"])
def test_both_workers_measured_at_every_concurrency_with_the_simulated_acceptance(results, impl):
    report, _, _ = results
    rows = [r for r in report["rows"] if r["impl"] == impl]
    assert [r.get("error") for r in rows] == [None] * len(rows)
    assert [r["concurrency"] for r in rows] == CONCURRENCY
    for row in rows:
        assert row["tokens"] == row["concurrency"] * MAX_NEW and row["tokens_per_s"] > 0
        # Mean committed tokens per step is ACC_LEN, except that the last step is cut at MAX_NEW.
        assert 2.0 <= row["accept_length"] <= ACC_LEN + 0.5


def test_our_steps_are_split_into_draft_verify_commit_and_overhead(results):
    report, stdout, out = results
    for row in (r for r in report["rows"] if r["impl"] == "ours"):
        assert row["steps"] >= (MAX_NEW - 1) // (ACC_LEN + 1)
        phases = row["draft_ms"] + row["verify_ms"] + row["accept_commit_ms"]
        assert 0 < phases <= row["step_ms"] * 1.01 and row["overhead_ms"] >= 0
    assert "| ours | 32 |" in stdout and "| builtin | 32 |" in stdout
    log = next((out / "ours").glob("server-*.log")).read_text(errors="replace")
    assert "acceptance lengths are SIMULATED" in log  # the loud start-up warning
