"""The drafter shipped for SmolLM2-135M-Instruct: its format, its size, and that it really drafts."""

from __future__ import annotations

import pytest

from sglang_dflash.assets import smollm2_drafter_dir
from sglang_dflash.drafter import DFlashDrafter
from sglang_dflash.generate import encode, stop_ids
from sglang_dflash.reference import ReferenceDecoder, generate_autoregressive
from sglang_dflash.targets import load_tokenizer

MAX_PACKAGE_BYTES = 30 * 1024 * 1024


def test_shipped_drafter_is_in_the_zlab_format_and_small():
    path = smollm2_drafter_dir()
    drafter = DFlashDrafter.from_pretrained(path)
    assert drafter.config.block_size == 16
    assert drafter.config.architectures == ["DFlashDraftModel"]
    assert sum(f.stat().st_size for f in path.iterdir()) <= MAX_PACKAGE_BYTES


@pytest.mark.slow
def test_shipped_drafter_is_lossless_and_accepts_more_than_one_token(smollm2):
    """Greedy output equals target-only output, and the drafts are accepted (a random drafter gives 1.0)."""
    tokenizer = load_tokenizer("smollm2")
    drafter = DFlashDrafter.from_pretrained(smollm2_drafter_dir(), dtype=smollm2.model.dtype)
    decoder = ReferenceDecoder(smollm2, drafter)
    prompts = [encode(tokenizer, text, chat=True) for text in
               ("Write a quicksort in Python.", "What is 17 times 23? Please reason step by step.")]
    stops = stop_ids(tokenizer, smollm2)
    speculative = decoder.generate(prompts, 96, stop_token_ids=stops)
    baseline = generate_autoregressive(smollm2, prompts, 96, stop_token_ids=stops)
    assert [g.output_ids for g in speculative] == [g.output_ids for g in baseline]
    steps = sum(len(g.acceptance_lengths) for g in speculative)
    mean = sum(sum(g.acceptance_lengths) for g in speculative) / steps
    # A random drafter gives 1.00; the shipped one gave 1.39 on average over the benchmark sets
    # (README's acceptance table).
    assert mean > 1.05, f"mean acceptance length {mean:.2f}: the shipped drafter does not draft"
