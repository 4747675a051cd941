"""The generate CLI, run as a user would (a real subprocess) on SmolLM2 with a random drafter."""

import json
import subprocess
import sys

import pytest


def _run(*args):
    return subprocess.run([sys.executable, "-m", "sglang_dflash.generate", *args], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def smollm2_drafter(smollm2, checkpoints):
    return checkpoints.drafter(
        hidden_size=smollm2.hidden_size, num_target_layers=smollm2.num_layers, vocab_size=smollm2.vocab_size,
        num_layers=1, num_heads=9, num_kv_heads=3, head_dim=64,
    )


def test_generate_json_compare_ar(smollm2_drafter):
    done = _run("--target", "smollm2", "--drafter", str(smollm2_drafter), "--prompt", "Write a quicksort in Python.",
                "--chat", "--max-new-tokens", "24", "--temperature", "0", "--block-size", "8", "--dtype", "float32",
                "--json", "--compare-ar")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["identical"] is True
    assert report["output_ids"] == report["ar_output_ids"] and len(report["output_ids"]) == 24
    assert sum(report["acceptance_lengths"]) == 23 and report["block_size"] == 8
    assert "quicksort" in report["text"] or "def" in report["text"]


def test_generate_reports_bad_input_clearly(smollm2_drafter, tmp_path):
    missing = _run("--drafter", str(tmp_path / "nope"), "--prompt", "hi")
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    too_big = _run("--drafter", str(smollm2_drafter), "--prompt", "hi", "--block-size", "64")
    assert too_big.returncode == 2 and "trained block size 16" in too_big.stderr
