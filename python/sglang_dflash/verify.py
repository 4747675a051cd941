"""The acceptance rule: which drafted tokens the target keeps, and its own next token.

A block is `[anchor, d1, ..., d_{n-1}]`. The target's verify pass gives, at block column j, its
distribution for the token *after* column j. Draft d_j (column j) is checked against column j-1:
  greedy   : kept while d_j equals the target's argmax there;
  sampling : kept with probability p_{j-1}(d_j) (the drafter proposes its argmax, a point mass, so
             min(1, p/q) = p); at the first rejection the target's token is drawn from p_{j-1}
             with d_j removed and renormalised. If every draft is kept, the token is drawn from the
             last column. This leaves the output distributed exactly as target-only sampling.
The result per request is `accept_len` = kept drafts + 1: the tokens emitted this step and also
the number of block rows (anchor + kept drafts) whose target KV stays valid.
This is the plain-PyTorch twin of the block verifier kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .sampling import draw, probabilities


@dataclass
class VerifyResult:
    accept_lens: torch.Tensor  # [bs] int64: kept drafts + the target's own token
    emitted: torch.Tensor  # [bs, B] int64: first accept_lens[i] entries are the tokens to emit


def _emit(block_tokens: torch.Tensor, kept: torch.Tensor, next_tokens: torch.Tensor) -> VerifyResult:
    """Row i emits block_tokens[i, 1:1+kept] then next_tokens[i]."""
    emitted = torch.roll(block_tokens, shifts=-1, dims=1).clone()
    emitted.scatter_(1, kept[:, None], next_tokens[:, None])
    return VerifyResult(accept_lens=kept + 1, emitted=emitted)


def _leading_true(flags: torch.Tensor) -> torch.Tensor:
    """Number of leading True values per row."""
    return flags.to(torch.int64).cumprod(dim=1).sum(dim=1)


def _draft_columns_in_block(block_tokens: torch.Tensor, block_lens: torch.Tensor) -> torch.Tensor:
    columns = torch.arange(1, block_tokens.shape[1], device=block_tokens.device)
    return columns[None, :] < block_lens[:, None]


def verify_greedy(block_tokens: torch.Tensor, target_tokens: torch.Tensor, block_lens: torch.Tensor) -> VerifyResult:
    """block_tokens, target_tokens: [bs, B] (target_tokens[:, j] = target argmax after column j)."""
    matches = (block_tokens[:, 1:] == target_tokens[:, :-1]) & _draft_columns_in_block(block_tokens, block_lens)
    kept = _leading_true(matches)
    return _emit(block_tokens, kept, target_tokens.gather(1, kept[:, None])[:, 0])


def verify_sampling(
    block_tokens: torch.Tensor,
    target_probs: torch.Tensor,
    block_lens: torch.Tensor,
    accept_uniforms: torch.Tensor,
    token_uniforms: torch.Tensor,
) -> VerifyResult:
    """target_probs: [bs, B, V]; accept_uniforms: [bs, B-1]; token_uniforms: [bs]; all uniforms in [0, 1)."""
    drafts = block_tokens[:, 1:]
    draft_probs = target_probs[:, :-1].gather(-1, drafts[..., None])[..., 0]
    accepted = (accept_uniforms < draft_probs) & _draft_columns_in_block(block_tokens, block_lens)
    kept = _leading_true(accepted)
    rows = torch.arange(block_tokens.shape[0], device=block_tokens.device)
    next_probs = target_probs[rows, kept].clone()
    rejected = kept < block_lens - 1
    if rejected.any():
        rejected_token = drafts.gather(1, kept.clamp(max=drafts.shape[1] - 1)[:, None])[:, 0]
        residual = next_probs.clone()
        residual[rows, rejected_token] = 0.0
        usable = rejected & (residual.sum(dim=-1) > 0)
        next_probs = torch.where(usable[:, None], residual, next_probs)
    return _emit(block_tokens, kept, draw(next_probs, token_uniforms))


def verify_block(
    block_tokens: torch.Tensor,
    target_logits: torch.Tensor,
    block_lens: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    top_k: torch.Tensor,
    generator: torch.Generator | None = None,
) -> VerifyResult:
    """Mixed batch: greedy rows (temperature 0) by argmax, the others by the sampling rule."""
    if (temperature == 0).all():
        return verify_greedy(block_tokens, target_logits.argmax(dim=-1), block_lens)
    bs, width = block_tokens.shape
    accept_uniforms = torch.rand(bs, width - 1, generator=generator, device=block_tokens.device)
    token_uniforms = torch.rand(bs, generator=generator, device=block_tokens.device)
    return verify_block_with_uniforms(
        block_tokens, target_logits, block_lens, temperature, top_p, top_k, accept_uniforms, token_uniforms
    )


def verify_block_with_uniforms(
    block_tokens: torch.Tensor,
    target_logits: torch.Tensor | None,
    block_lens: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    top_k: torch.Tensor,
    accept_uniforms: torch.Tensor,
    token_uniforms: torch.Tensor,
    target_tokens: torch.Tensor | None = None,
) -> VerifyResult:
    """`verify_block` with its random draws given: accept_uniforms [bs, B-1], token_uniforms [bs].

    Greedy rows use `target_tokens` [bs, B] when given (the target's own argmax), else the logits'
    argmax; an all-greedy batch needs no logits at all. The block verifier kernel's twin.
    """
    greedy_rows = temperature == 0
    if target_tokens is None:
        target_tokens = target_logits.argmax(dim=-1)
    result = verify_greedy(block_tokens, target_tokens, block_lens)
    if greedy_rows.all():
        return result
    probs = probabilities(target_logits, temperature, top_p, top_k)
    sampled = verify_sampling(block_tokens, probs, block_lens, accept_uniforms, token_uniforms)
    return VerifyResult(
        accept_lens=torch.where(greedy_rows, result.accept_lens, sampled.accept_lens),
        emitted=torch.where(greedy_rows[:, None], result.emitted, sampled.emitted),
    )
