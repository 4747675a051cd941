"""The two SpecInput objects our worker hands SGLang's scheduler and target runner.

`DraftState` travels between steps (the scheduler keeps it as `batch.spec_info`): the bonus token
of every request and, before each decode step, the KV slots the next block will use.
`BlockVerifyInput` describes one TARGET_VERIFY forward: B tokens per request, all logits kept,
the chosen target layers captured.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
from sglang.srt.mem_cache.allocation import alloc_for_spec_decode
from sglang.srt.mem_cache.allocation_sizing import page_aligned_decode_alloc_lens
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
from sglang.srt.runtime_context import get_spec
from sglang.srt.speculative.spec_info import SpecInput, SpecInputType


@dataclass
class DraftState(SpecInput):
    bonus_tokens: torch.Tensor  # [bs] the newest token of each request (block column 0 next step)
    new_seq_lens: torch.Tensor  # [bs] committed KV length after the step that made this state
    # The overlap FutureMap stashes these for EAGLE-style algorithms; DFLASH relays none of them.
    topk_p: Optional[torch.Tensor] = None
    topk_index: Optional[torch.Tensor] = None
    hidden_states: Optional[torch.Tensor] = None
    future_indices: Optional[torch.Tensor] = None  # set by the scheduler under overlap
    reserved_kv_lens_cpu: Optional[torch.Tensor] = field(default=None, repr=False)

    def __post_init__(self):
        super().__init__(spec_input_type=SpecInputType.DFLASH_DRAFT)
        # Token accounting: a draft state itself adds one (bonus) token per request.
        self.num_tokens_per_req = 1
        self.num_tokens_for_logprob_per_req = 1

    @classmethod
    def empty(cls, device) -> "DraftState":
        return cls(
            bonus_tokens=torch.empty((0,), dtype=torch.int64, device=device),
            new_seq_lens=torch.empty((0,), dtype=torch.int64, device=device),
        )

    def prepare_for_decode(self, batch) -> None:
        """Reserve two blocks of KV slots past each committed length, before the step runs.

        Two blocks, because under the overlapped schedule the committed length the scheduler
        sees lags the running step by one. The slots go into `req_to_token`, so the worker reads
        a block's slots from there; rejected rows are simply overwritten by the next block.
        """
        bs = batch.batch_size()
        if bs == 0:
            return
        batch.maybe_evict_swa()
        block_size = int(get_spec().speculative_num_draft_tokens)
        page_size = batch.token_to_kv_pool_allocator.page_size
        cur, nxt, needed = page_aligned_decode_alloc_lens(batch.reqs, reserve=2 * block_size, page_size=page_size)
        committed = [int(req.kv.kv_committed_len) for req in batch.reqs]
        cur_cpu = torch.tensor(cur, dtype=torch.int32)
        nxt_cpu = torch.tensor(nxt, dtype=torch.int32)
        alloc_for_spec_decode(
            batch.tree_cache,
            batch.req_to_token_pool,
            reqs=batch.reqs,
            req_pool_indices=batch.req_pool_indices,
            cur_kv_lens=cur_cpu.to(batch.device),
            cur_kv_lens_cpu=cur_cpu,
            nxt_kv_lens=nxt_cpu.to(batch.device),
            nxt_kv_lens_cpu=nxt_cpu,
            num_needed_tokens=needed,
            batch=batch,
        )
        for req in batch.reqs:
            req.decode_batch_idx += 1
        # Host lengths are the committed ones; under overlap the scheduler replaces them with
        # the lengths the previous step publishes.
        batch.seq_lens_cpu = torch.tensor(committed, dtype=torch.int64)
        batch.seq_lens_sum = sum(committed)
        self.reserved_kv_lens_cpu = nxt_cpu

    def filter_batch(self, new_indices: torch.Tensor, new_indices_cpu: Optional[list[int]] = None):
        if self.reserved_kv_lens_cpu is not None:
            keep = new_indices_cpu if new_indices_cpu is not None else new_indices.cpu()
            self.reserved_kv_lens_cpu = self.reserved_kv_lens_cpu[keep]
        if self.future_indices is not None:
            self.future_indices = self.future_indices[new_indices]
            return
        self.bonus_tokens = self.bonus_tokens[new_indices]
        self.new_seq_lens = self.new_seq_lens[new_indices]

    def merge_batch(self, other: "DraftState"):
        if self.reserved_kv_lens_cpu is not None or other.reserved_kv_lens_cpu is not None:
            parts = [p for p in (self.reserved_kv_lens_cpu, other.reserved_kv_lens_cpu) if p is not None]
            self.reserved_kv_lens_cpu = torch.cat(parts)
        if self.future_indices is not None:
            self.future_indices = torch.cat([self.future_indices, other.future_indices])
            return
        self.bonus_tokens = torch.cat([self.bonus_tokens, other.bonus_tokens])
        self.new_seq_lens = torch.cat([self.new_seq_lens, other.new_seq_lens])


@dataclass
class BlockVerifyInput(SpecInput):
    draft_token: torch.Tensor  # [bs * B] the blocks, flat
    positions: torch.Tensor  # [bs * B]
    draft_token_num: int  # B
    topk: int = 1
    capture_hidden_mode: CaptureHiddenMode = CaptureHiddenMode.FULL

    def __post_init__(self):
        super().__init__(spec_input_type=SpecInputType.DFLASH_VERIFY)
        self.num_tokens_per_req = int(self.draft_token_num)
        self.num_tokens_for_logprob_per_req = int(self.draft_token_num)

    @property
    def tree_topk(self) -> int:  # read by the intel_amx backend
        return 1
