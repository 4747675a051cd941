"""SGLANG_SIMULATE_ACC_LEN: a fixed acceptance length for speed benchmarks (output is not the target's).

SGLang 0.5.23 reads the same variable in its EAGLE and DFLASH workers: a float, off when unset or
<= 0, meaning the number of tokens committed per step (kept drafts + the target's own token),
clamped to [1, block size] and drawn as its floor or its ceiling with the probabilities that make
the mean exact (its default "match-expected" method). We draw per request rather than once per
step (the same mean), and emit the real drafts followed by the target's greedy token at the
first rejected column (SGLang's "real-draft-token" mode), so token ids stay ordinary text and
stop handling runs as it would. Verify still runs in full, so its cost is measured.
"""

from __future__ import annotations

import os

import torch

from ..kernels.block_verify import BlockVerifyOutput

SIMULATE_VARIABLE = "SGLANG_SIMULATE_ACC_LEN"


def simulated_accept_length() -> float | None:
    """The mean acceptance length to simulate, or None when SGLANG_SIMULATE_ACC_LEN is off."""
    raw = os.environ.get(SIMULATE_VARIABLE, "").strip()
    if not raw:
        return None
    value = float(raw)
    return value if value > 0 else None


def draw_accept_lens(mean: float, batch_size: int, block_size: int, device=None, generator=None) -> torch.Tensor:
    """Per request floor(m) or floor(m)+1 with m = mean clamped to [1, block]; E[result] = m."""
    clamped = min(max(mean, 1.0), float(block_size))
    lower = int(clamped)
    upper_probability = clamped - lower
    upper = torch.rand(batch_size, generator=generator) < upper_probability
    lens = (lower + upper.to(torch.int64)).clamp(max=block_size)
    return lens.to(device) if device is not None else lens


def simulate_acceptance(blocks: torch.Tensor, logits: torch.Tensor, mean: float) -> BlockVerifyOutput:
    """The verifier's output with accept_lens drawn around `mean` instead of computed.

    blocks: [bs, B] (anchor, drafts); logits: [bs, B, vocab] from the verify pass.
    """
    bs, width = blocks.shape
    accept_lens = draw_accept_lens(mean, bs, width, device=blocks.device)
    emitted = torch.empty_like(blocks)
    emitted[:, : width - 1] = blocks[:, 1:]
    target_tokens = logits.argmax(dim=-1).to(blocks.dtype)  # [bs, B]
    last = (accept_lens - 1)[:, None]
    emitted.scatter_(1, last, target_tokens.gather(1, last))
    columns = torch.arange(width, device=blocks.device)
    kept_rows = columns[None, :] < accept_lens[:, None]
    return BlockVerifyOutput(accept_lens, emitted, kept_rows)
