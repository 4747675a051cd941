"""The acceptance-table tool, run as a user would (a real subprocess), in both of its modes.

A tiny random Qwen3 target with SmolLM2's tokenizer and chat template and a random drafter: the
reference decoder and a real SGLang DFLASH server with our worker are both exact at temperature 0 in
float32, so they must emit the same tokens in the same verify steps and print the same figures.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sglang_dflash.targets import smollm2_hf_dir

pytestmark = pytest.mark.server

SETS = "gsm8k,mbpp"
PROMPTS = 3
MAX_NEW = 10


def run_tool(target, drafter, out, *extra):
    command = [sys.executable, "-m", "sglang_dflash.train.acceptance", "--target", str(target), "--drafter", str(drafter),
               "--datasets", SETS, "--num-prompts", str(PROMPTS), "--max-new-tokens", str(MAX_NEW), "--out", str(out),
               *extra]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout, json.loads(out.read_text())


@pytest.fixture(scope="module")
def pair(checkpoints):
    target = checkpoints.target("qwen3", tokenizer_from=smollm2_hf_dir())
    drafter = checkpoints.drafter(hidden_size=64, num_target_layers=4, vocab_size=49152, block_size=8)
    return target, drafter


def test_server_and_reference_modes_agree_token_for_token(pair, tmp_path):
    _, reference = run_tool(*pair, tmp_path / "reference.json", "--batch", "2")
    stdout, server = run_tool(*pair, tmp_path / "server.json", "--server")
    assert reference["decoder"] == "reference" and server["decoder"] == "sglang server"
    assert list(server["sets"]) == SETS.split(",") and server["block_size"] == 8
    for name in SETS.split(","):
        ours, exact = server["sets"][name], reference["sets"][name]
        assert ours["prompts"] == exact["prompts"] == PROMPTS
        assert ours["output_tokens"] == exact["output_tokens"] and 0 < ours["output_tokens"] <= PROMPTS * MAX_NEW
        assert ours["verify_steps"] == exact["verify_steps"] > 0
        # the prefill's first token of each answer is not a verify step's
        expected = (ours["output_tokens"] - PROMPTS) / ours["verify_steps"]
        assert ours["mean_acceptance_length"] == pytest.approx(expected) == exact["mean_acceptance_length"]
        assert 1.0 <= expected <= 8
        assert sum(exact["histogram"]) == exact["verify_steps"]
        assert f"| {name} | {PROMPTS} | {ours['output_tokens']} | {ours['verify_steps']} |" in stdout
    assert server["average"] == pytest.approx(sum(s["mean_acceptance_length"] for s in server["sets"].values()) / 2)
