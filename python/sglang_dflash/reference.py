"""The reference decoder: DFlash speculative decoding in plain PyTorch, the oracle for every other path.

A batch of requests with ragged prompts advances in lock step. One step is:
  1. draft  : the drafter reads each request's committed context and the block
              [anchor, MASK x (B-1)] and proposes its argmax at positions 1..B-1;
  2. verify : the target runs over each block and returns logits plus the chosen layers' features;
  3. accept : `verify.verify_block` gives each request's accepted length and tokens to emit;
  4. commit : the target KV cache and the draft context keep exactly the anchor + accepted drafts;
              the emitted tokens are appended, cut at a stop token or `max_new_tokens`.
The target runs once per request (batch 1) so each request's numerics equal its solo run; the
drafter and the acceptance rule run batched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from .drafter import DFlashDrafter, DraftContext
from .sampling import SamplingParams, batch_params, sample_next
from .targets import TargetModel
from .verify import VerifyResult, verify_block


@dataclass
class Generation:
    output_ids: list[int]
    acceptance_lengths: list[int]  # tokens committed per verify step (the target's own token included)
    finish_reason: str  # "stop" or "length"

    @property
    def mean_acceptance_length(self) -> float:
        return sum(self.acceptance_lengths) / len(self.acceptance_lengths) if self.acceptance_lengths else 0.0


@dataclass
class _Request:
    prompt: list[int]
    params: SamplingParams
    max_new_tokens: int
    stop_token_ids: frozenset[int]
    target_cache: object
    context: DraftContext = field(default_factory=DraftContext)
    output: list[int] = field(default_factory=list)
    acceptance_lengths: list[int] = field(default_factory=list)
    finish_reason: str | None = None

    @property
    def committed_len(self) -> int:
        """Tokens whose target KV is cached: everything but the anchor (the newest token)."""
        return len(self.prompt) + len(self.output) - 1

    def emit(self, tokens: Sequence[int]) -> int:
        """Append tokens up to a stop token or the length limit; returns how many were kept."""
        kept = 0
        for token in tokens:
            self.output.append(int(token))
            kept += 1
            if token in self.stop_token_ids:
                self.finish_reason = "stop"
            elif len(self.output) >= self.max_new_tokens:
                self.finish_reason = "length"
            if self.finish_reason:
                break
        return kept

    def result(self) -> Generation:
        return Generation(list(self.output), list(self.acceptance_lengths), self.finish_reason or "length")


VerifyFn = Callable[..., VerifyResult]


class ReferenceDecoder:
    def __init__(
        self,
        target: TargetModel,
        drafter: DFlashDrafter,
        block_size: int | None = None,
        verify_fn: VerifyFn = verify_block,
    ):
        self.block_size = block_size or drafter.block_size
        drafter.config.check_block_size(self.block_size)
        drafter.config.check_target(target.hidden_size, target.num_layers, target.vocab_size)
        target.capture_layers(drafter.config.target_layer_ids)
        self.target, self.drafter, self.verify_fn = target, drafter, verify_fn

    @torch.inference_mode()
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        sampling: SamplingParams | Sequence[SamplingParams] = SamplingParams(),
        stop_token_ids: Sequence[int] = (),
        seed: int = 0,
    ) -> list[Generation]:
        if max_new_tokens < 1:
            raise ValueError("max_new_tokens must be at least 1")
        params = [sampling] * len(prompts) if isinstance(sampling, SamplingParams) else list(sampling)
        generator = torch.Generator(device=self.target.device).manual_seed(seed)
        requests = [
            _Request(list(p), sp, max_new_tokens, frozenset(stop_token_ids), self.target.new_cache())
            for p, sp in zip(prompts, params, strict=True)
        ]
        for request in requests:
            self._prefill(request, generator)
        while active := [r for r in requests if r.finish_reason is None]:
            self._step(active, generator)
        return [r.result() for r in requests]

    def _prefill(self, request: _Request, generator: torch.Generator) -> None:
        if not request.prompt:
            raise ValueError("empty prompt")
        positions = torch.arange(len(request.prompt), device=self.target.device)
        logits, features = self.target.forward(self._ids(request.prompt), positions, request.target_cache)
        request.context.append(self.drafter.context_keys_values(features, positions), positions)
        request.emit([sample_next(logits[-1], request.params, generator)])

    def _step(self, active: list[_Request], generator: torch.Generator) -> None:
        device, width = self.target.device, self.block_size
        starts = torch.tensor([r.committed_len for r in active], device=device)
        positions = starts[:, None] + torch.arange(width, device=device)[None, :]
        block_lens = torch.tensor([min(width, r.max_new_tokens - len(r.output)) for r in active], device=device)

        blocks = self._draft(active, positions)  # 1. draft

        logits = torch.zeros(len(active), width, self.target.vocab_size, device=device)  # 2. verify
        features = []
        for i, request in enumerate(active):
            n = int(block_lens[i])
            logits[i, :n], row_features = self.target.forward(blocks[i, :n], positions[i, :n], request.target_cache)
            features.append(row_features)

        temperature, top_p, top_k = batch_params([r.params for r in active], device)  # 3. accept
        result = self.verify_fn(blocks, logits, block_lens, temperature, top_p, top_k, generator)

        for i, request in enumerate(active):  # 4. commit
            kept = int(result.accept_lens[i])
            self.target.crop(request.target_cache, request.committed_len + kept)
            kept_positions = positions[i, :kept]
            request.context.append(self.drafter.context_keys_values(features[i][:kept], kept_positions), kept_positions)
            request.acceptance_lengths.append(request.emit(result.emitted[i, :kept].tolist()))

    def _draft(self, active: list[_Request], positions: torch.Tensor) -> torch.Tensor:
        blocks = torch.full(positions.shape, self.drafter.mask_token_id, dtype=torch.long, device=positions.device)
        blocks[:, 0] = torch.tensor([r.output[-1] for r in active], device=positions.device)
        hidden = self.drafter(self.target.embed(blocks), positions, [r.context for r in active])
        blocks[:, 1:] = self.drafter.logits(hidden[:, 1:], self.target.lm_head).argmax(dim=-1)
        return blocks

    def _ids(self, tokens: Sequence[int]) -> torch.Tensor:
        return torch.tensor(list(tokens), dtype=torch.long, device=self.target.device)


@torch.inference_mode()
def generate_autoregressive(
    target: TargetModel,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    sampling: SamplingParams | Sequence[SamplingParams] = SamplingParams(),
    stop_token_ids: Sequence[int] = (),
    seed: int = 0,
) -> list[Generation]:
    """Target-only decoding, one token per forward: the baseline speculative output must equal."""
    params = [sampling] * len(prompts) if isinstance(sampling, SamplingParams) else list(sampling)
    generator = torch.Generator(device=target.device).manual_seed(seed)
    results = []
    for prompt, sp in zip(prompts, params, strict=True):
        request = _Request(list(prompt), sp, max_new_tokens, frozenset(stop_token_ids), target.new_cache())
        ids = torch.tensor(request.prompt, device=target.device)
        positions = torch.arange(len(ids), device=target.device)
        while True:
            logits, _ = target.forward(ids, positions, request.target_cache)
            request.emit([sample_next(logits[-1], sp, generator)])
            if request.finish_reason:
                break
            ids = torch.tensor(request.output[-1:], device=target.device)
            positions = positions[-1:] + 1
        results.append(request.result())
    return results
