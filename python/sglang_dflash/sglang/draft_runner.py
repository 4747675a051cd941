"""The drafter inside SGLang: our `DFlashDrafter`, its paged context-KV pool, and one draft pass.

The draft pool has one K and one V buffer per draft layer, indexed by the *target's* KV slot ids
(the worker borrows the target's `req_to_token` and allocator), so a slot holds the target KV of
a token and, here, the draft context K/V of the same token. That makes radix-cache hits reuse
draft context for free, provided every slot the target writes gets its draft K/V in the same
call: prefill writes all extend tokens, decode writes the committed block rows.

Each draft layer's attention reads that pool through `req_to_token` with one of three cores of
the same signature (`--speculative-draft-attention-backend`):
  triton  our Triton kernel (sglang_dflash.kernels.draft_attention_triton);
  fa4     SGLang's FA4 kernel, where this GPU has it (else triton);
  torch   the kernel's plain-PyTorch twin: any other name, and every backend on a CPU.
"""

from __future__ import annotations

import logging

import torch

from ..drafter import DFlashDrafter
from ..kernels import draft_attention_reference, draft_attention_triton

logger = logging.getLogger(__name__)

DRAFT_ATTENTION_CORES = ("triton", "fa4", "torch")


def resolve_draft_attention_core(requested: str | None, device, dtype: torch.dtype) -> str:
    """Which core serves SGLang's --speculative-draft-attention-backend value on this device."""
    if torch.device(device).type != "cuda":
        return "torch"
    if requested in ("triton", "fa4") and dtype not in (torch.bfloat16, torch.float16):
        logger.warning("sglang-dflash: the draft attention kernels take bf16/fp16, not %s; using the torch twin", dtype)
        return "torch"
    if requested == "fa4":
        if fa4_available(device):
            return "fa4"
        logger.warning("sglang-dflash: FA4 is not available on this GPU; the draft attention uses our Triton kernel")
        return "triton"
    return "triton" if requested == "triton" else "torch"


def fa4_available(device) -> bool:
    try:
        from sglang.kernels.ops.attention.flash_attention_v4 import is_flash_attention_v4_available
    except ImportError:
        return False
    return is_flash_attention_v4_available() and torch.cuda.get_device_capability(device)[0] in (9, 10)


def fa4_draft_attention(queries, block_keys, block_values, key_pool, value_pool, req_to_token, req_pool_indices,
                        context_lens, window=None, causal=False, scale=None, max_context_len=None):
    """The twin's signature over SGLang's FA4 paged kernel (page size 1).

    FA4 reads keys only from the pool, so the block's own K/V are first written at the block's
    reserved slots; those rows are overwritten with context K/V when they commit, and never read
    as context before (context is the first `context_lens` tokens).
    """
    from sglang.kernels.ops.attention.flash_attention_v4 import flash_attn_varlen_func

    batch, block_len, heads, head_dim = queries.shape
    rows = req_pool_indices.to(torch.int64)
    lengths = context_lens.to(torch.int64)
    block_positions = lengths[:, None] + torch.arange(block_len, device=queries.device)[None, :]
    block_slots = req_to_token[rows[:, None], block_positions].to(torch.int64)
    key_pool[block_slots] = block_keys
    value_pool[block_slots] = block_values
    side = -1 if window is None else window - 1  # FA windows are inclusive: |q - k| <= side
    out = flash_attn_varlen_func(
        q=queries.reshape(batch * block_len, heads, head_dim),
        k=key_pool.unsqueeze(1),
        v=value_pool.unsqueeze(1),
        cu_seqlens_q=torch.arange(0, (batch + 1) * block_len, block_len, dtype=torch.int32, device=queries.device),
        seqused_k=(lengths + block_len).to(torch.int32),
        max_seqlen_q=block_len,
        page_table=req_to_token[rows].to(torch.int32),
        softmax_scale=scale,
        causal=bool(causal),
        window_size=(side, side),
    )
    out = out[0] if isinstance(out, tuple) else out
    return out.view(batch, block_len, heads, head_dim)


_CORES = {"triton": draft_attention_triton, "fa4": fa4_draft_attention, "torch": draft_attention_reference}


class DraftRunner:
    def __init__(self, drafter: DFlashDrafter, pool_slots: int, device, embed, lm_head, attention_core: str = "torch"):
        self.drafter = drafter.to(device).eval()
        config = drafter.config
        dtype = drafter.fc.weight.dtype
        shape = (pool_slots, config.num_key_value_heads, config.head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in drafter.layers]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in drafter.layers]
        if attention_core not in _CORES:
            raise ValueError(f"draft attention core must be one of {DRAFT_ATTENTION_CORES}, got {attention_core!r}")
        self.attention_core = attention_core
        self.attention = _CORES[attention_core]
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

    @torch.inference_mode()
    def propose(self, bonus_tokens, seq_lens, req_to_token, req_pool_indices, mask_token_id: int, width: int):
        """Blocks [bs, width]: column 0 the bonus token, columns 1.. the drafter's argmax."""
        bs = bonus_tokens.shape[0]
        blocks = torch.full((bs, width), mask_token_id, dtype=torch.int64, device=self.device)
        blocks[:, 0] = bonus_tokens
        positions = seq_lens.to(torch.int64)[:, None] + torch.arange(width, device=self.device)[None, :]
        if width == 1:
            return blocks, positions
        max_context_len = int(seq_lens.max())  # one host sync per step, shared by every layer

        def attention(layer, attn, queries, block_keys, block_values):
            return self.attention(
                queries, block_keys, block_values, self.keys[layer], self.values[layer], req_to_token,
                req_pool_indices, seq_lens, window=attn.window, causal=attn.causal, max_context_len=max_context_len,
            )

        hidden = self.drafter.forward_with_attention(self.embed(blocks), positions, attention)
        blocks[:, 1:] = self.drafter.logits(hidden[:, 1:], self.lm_head).argmax(dim=-1)
        return blocks, positions
