"""Sampling parameters and the one definition of "the target's distribution" used everywhere.

Temperature first, then top-k, then top-p on the renormalised top-k mass. Target-only sampling
and speculative verification both call `probabilities`, so the two sample the same law.
Draws take explicit uniforms (inverse CDF) so a kernel twin can be compared bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 means no top-k cut

    def __post_init__(self):
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def batch_params(params: list[SamplingParams], device="cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-request temperature, top_p, top_k as tensors [bs]."""
    return (
        torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device),
        torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device),
        torch.tensor([p.top_k for p in params], dtype=torch.long, device=device),
    )


def probabilities(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor):
    """logits [bs, n, V]; per-request params [bs]. Greedy rows (temperature 0) use temperature 1."""
    temperature = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
    scores = logits.float() / temperature[:, None, None]
    vocab = scores.shape[-1]
    sorted_scores, order = scores.sort(dim=-1, descending=True, stable=True)
    sorted_probs = sorted_scores.softmax(dim=-1)
    rank = torch.arange(vocab, device=logits.device)
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab))
    sorted_probs = sorted_probs * (rank[None, None, :] < k[:, None, None])
    sorted_probs = sorted_probs / sorted_probs.sum(dim=-1, keepdim=True)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    sorted_probs = sorted_probs * (mass_before < top_p[:, None, None])
    sorted_probs = sorted_probs / sorted_probs.sum(dim=-1, keepdim=True)
    return torch.zeros_like(sorted_probs).scatter(-1, order, sorted_probs)


def draw(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw: probs [..., V], uniforms [...] in [0, 1) -> token ids [...]."""
    cdf = probs.cumsum(dim=-1)
    target = uniforms[..., None].to(cdf.dtype) * cdf[..., -1:]
    # side="right": the first token whose cumulative mass exceeds the draw, never a zero-mass token.
    index = torch.searchsorted(cdf, target, right=True)
    return index.clamp_(max=probs.shape[-1] - 1).squeeze(-1)


def sample_next(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None):
    """Target-only next token from logits [V] (greedy argmax or a draw from `probabilities`)."""
    if params.greedy:
        return int(logits.argmax())
    temperature, top_p, top_k = batch_params([params], logits.device)
    probs = probabilities(logits.view(1, 1, -1), temperature, top_p, top_k)[0, 0]
    uniform = torch.rand((), generator=generator, device=logits.device)
    return int(draw(probs, uniform))
