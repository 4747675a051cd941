"""The worker's benchmark knobs: SGLANG_SIMULATE_ACC_LEN and SGLANG_DFLASH_STEP_TIMES."""

from __future__ import annotations

import json

import pytest
import torch

from sglang_dflash.sglang.simulated_acceptance import draw_accept_lens, simulate_acceptance, simulated_accept_length
from sglang_dflash.sglang.step_times import NoStepTimes, StepTimes, step_times_from_env


@pytest.mark.parametrize("raw, expected", [(None, None), ("", None), ("-1", None), ("0", None), ("3.5", 3.5)])
def test_the_variable_is_off_when_unset_or_not_positive(monkeypatch, raw, expected):
    if raw is None:
        monkeypatch.delenv("SGLANG_SIMULATE_ACC_LEN", raising=False)
    else:
        monkeypatch.setenv("SGLANG_SIMULATE_ACC_LEN", raw)
    assert simulated_accept_length() == expected


@pytest.mark.parametrize("mean", [1.0, 2.3, 6.0, 7.75])
def test_drawn_lengths_are_floor_or_ceiling_with_the_exact_mean(mean):
    lens = draw_accept_lens(mean, 40_000, 16, generator=torch.Generator().manual_seed(0))
    assert set(lens.unique().tolist()) <= {int(mean), int(mean) + 1}
    assert lens.double().mean().item() == pytest.approx(mean, abs=0.01)


@pytest.mark.parametrize("mean, block, clamped", [(0.2, 16, 1), (30.0, 16, 16), (16.0, 16, 16), (5.5, 4, 4)])
def test_drawn_lengths_are_clamped_to_one_and_the_block(mean, block, clamped):
    assert draw_accept_lens(mean, 1000, block).tolist() == [clamped] * 1000


def test_simulated_step_emits_the_drafts_then_the_targets_token():
    torch.manual_seed(0)
    bs, width, vocab = 64, 8, 50
    blocks = torch.randint(0, vocab, (bs, width))
    logits = torch.randn(bs, width, vocab)
    out = simulate_acceptance(blocks, logits, 3.4)
    assert set(out.accept_lens.tolist()) <= {3, 4}
    target = logits.argmax(-1)
    for row in range(bs):
        n = int(out.accept_lens[row])
        assert out.emitted[row, : n - 1].tolist() == blocks[row, 1:n].tolist()  # forced-kept drafts
        assert int(out.emitted[row, n - 1]) == int(target[row, n - 1])  # then the target's own token
        assert out.kept_rows[row].tolist() == [c < n for c in range(width)]


def test_step_times_write_one_json_line_per_step(tmp_path, monkeypatch):
    path = tmp_path / "steps.jsonl"
    monkeypatch.setenv("SGLANG_DFLASH_STEP_TIMES", str(path))
    timer = step_times_from_env("cpu")
    assert isinstance(timer, StepTimes)
    for step in range(2):
        timer.start_step()
        for name in ("draft", "verify", "accept_commit"):
            with timer.phase(name):
                torch.ones(64, 64) @ torch.ones(64, 64)
        timer.end_step(3, torch.tensor([1, 2, 4]))
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(records) == 2 and all(r["batch_size"] == 3 and r["tokens"] == 7 for r in records)
    for r in records:
        phases = r["draft_s"] + r["verify_s"] + r["accept_commit_s"]
        assert 0 < phases <= r["end"] - r["start"]
    assert records[1]["start"] >= records[0]["end"]
    monkeypatch.delenv("SGLANG_DFLASH_STEP_TIMES")
    assert isinstance(step_times_from_env("cpu"), NoStepTimes)
