"""The drafter inside SGLang: our `DFlashDrafter`, its paged context-KV pool, and one draft pass.

The draft pool has one K and one V buffer per draft layer, indexed by the *target's* KV slot ids
(the worker borrows the target's `req_to_token` and allocator), so a slot holds the target KV of
a token and, here, the draft context K/V of the same token. That makes radix-cache hits reuse
draft context for free, provided every slot the target writes gets its draft K/V in the same
call: prefill writes all extend tokens, decode writes the committed block rows.
"""

from __future__ import annotations

import logging

import torch

from ..drafter import DFlashDrafter, PaddedContext

logger = logging.getLogger(__name__)


class DraftRunner:
    def __init__(self, drafter: DFlashDrafter, pool_slots: int, device, embed, lm_head):
        self.drafter = drafter.to(device).eval()
        config = drafter.config
        dtype = drafter.fc.weight.dtype
        shape = (pool_slots, config.num_key_value_heads, config.head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in drafter.layers]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in drafter.layers]
        # Sliding layers never look further back than their window; full layers need everything.
        windows = [config.window_for_layer(i) for i in range(config.num_hidden_layers)]
        self.lookback = None if any(w is None for w in windows) else max(windows)
        self.embed, self.lm_head = embed, lm_head
        self.device = device

    @property
    def block_size(self) -> int:
        return self.drafter.block_size

    def write_context(self, target_features: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor) -> None:
        """Turn target features of committed tokens into draft context K/V at their KV slots."""
        if slots.numel() == 0:
            return
        expected = self.drafter.config.num_context_features
        if target_features.shape[-1] != expected:
            raise RuntimeError(
                f"the target captured hidden states of width {target_features.shape[-1]}, the drafter reads "
                f"{expected} (layers {self.drafter.config.target_layer_ids}); this SGLang model cannot "
                "capture every requested layer (Qwen3, for one, cannot capture its last layer)"
            )
        for layer, (k, v) in enumerate(self.drafter.context_keys_values(target_features, positions)):
            self.keys[layer][slots] = k.to(self.keys[layer].dtype)
            self.values[layer][slots] = v.to(self.values[layer].dtype)

    def _gather_context(self, req_to_token, req_pool_indices, seq_lens) -> PaddedContext:
        """Right-padded context of each request, read from the pool through req_to_token."""
        lengths = seq_lens.to(torch.int64)
        starts = torch.zeros_like(lengths) if self.lookback is None else (lengths - self.lookback).clamp(min=0)
        width = int((lengths - starts).max()) if lengths.numel() else 0
        offsets = torch.arange(width, device=lengths.device)
        positions = starts[:, None] + offsets[None, :]
        valid = positions < lengths[:, None]
        positions = torch.where(valid, positions, torch.zeros_like(positions))
        slots = req_to_token[req_pool_indices.to(torch.int64)[:, None], positions].to(torch.int64)
        slots = torch.where(valid, slots, torch.zeros_like(slots))
        keys = [k[slots] for k in self.keys]
        values = [v[slots] for v in self.values]
        return PaddedContext(keys=keys, values=values, positions=positions, valid=valid)

    @torch.inference_mode()
    def propose(self, bonus_tokens, seq_lens, req_to_token, req_pool_indices, mask_token_id: int, width: int):
        """Blocks [bs, width]: column 0 the bonus token, columns 1.. the drafter's argmax."""
        bs = bonus_tokens.shape[0]
        blocks = torch.full((bs, width), mask_token_id, dtype=torch.int64, device=self.device)
        blocks[:, 0] = bonus_tokens
        positions = seq_lens.to(torch.int64)[:, None] + torch.arange(width, device=self.device)[None, :]
        if width == 1:
            return blocks, positions
        context = self._gather_context(req_to_token, req_pool_indices, seq_lens)
        hidden = self.drafter.forward_padded(self.embed(blocks), positions, context)
        blocks[:, 1:] = self.drafter.logits(hidden[:, 1:], self.lm_head).argmax(dim=-1)
        return blocks, positions
