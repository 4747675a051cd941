"""DFlashWorker: SGLang's speculative worker for DFLASH, one decode step top to bottom.

The scheduler calls `forward_batch_generation` for every batch:
  prefill : the target runs the prompt (capturing the drafter's layers); every prompt token's
            features become draft context K/V at its KV slot; the sampled token is the bonus.
  decode  : 1. draft  - blocks [bonus, MASK x (B-1)] at the reserved slots, the drafter's argmax;
            2. verify - one TARGET_VERIFY pass of the target over all blocks;
            3. accept - the block verifier (verify.py's rule; CUDA kernel on a GPU, twin elsewhere);
            4. commit - draft context K/V for the kept rows; the scheduler receives the tokens,
                        the accepted lengths (bonus included) and the new committed lengths.
Verify writes target KV for all B rows; only the committed ones count, the rest are overwritten
by the next block (the scheduler frees the reserved tail when a request ends).
Benchmark knobs: SGLANG_SIMULATE_ACC_LEN replaces step 3's lengths (`simulated_acceptance.py`);
SGLANG_DFLASH_STEP_TIMES times the phases (`step_times.py`).
"""

from __future__ import annotations

import logging
import os

import torch
from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
from sglang.srt.speculative.base_spec_worker import BaseSpecWorker

from .. import __version__
from ..drafter import DFlashDrafter
from ..kernels import block_verify
from ..kernels.block_verify import KernelBuildError, block_verify_reference
from .draft_runner import DraftRunner, resolve_draft_attention_core
from .simulated_acceptance import SIMULATE_VARIABLE, simulate_acceptance, simulated_accept_length
from .spec_inputs import BlockVerifyInput, DraftState
from .step_times import step_times_from_env

logger = logging.getLogger(__name__)


class DFlashStartupError(ValueError):
    """A drafter or flag that cannot serve with this target."""


class DFlashWorker(BaseSpecWorker):
    def __init__(self, server_args, gpu_id, nccl_port, target_worker, **_ignored):
        super().__init__()
        self._target_worker = target_worker
        self._draft_worker = None
        self.server_args = server_args
        self.device = target_worker.model_runner.device
        self.block_size = int(server_args.speculative_num_draft_tokens)
        self.drafter = load_checked_drafter(server_args.speculative_draft_model_path, target_worker, self.block_size)
        self.mask_token_id = self.drafter.mask_token_id
        self.runner: DraftRunner | None = None
        self._verifier_unavailable = False  # set once the CUDA verifier failed to build here
        self.simulated_accept_len = simulated_accept_length()
        self.step_times = step_times_from_env(self.device)
        if self.simulated_accept_len is not None:
            logger.warning(
                "sglang-dflash: %s=%s: acceptance lengths are SIMULATED around %.2f, the output is NOT the "
                "target's (for speed benchmarks only)",
                SIMULATE_VARIABLE, os.environ[SIMULATE_VARIABLE], self.simulated_accept_len,
            )  # fmt: skip
        logger.info(
            "sglang-dflash %s: DFLASH served by our worker (block size %d, drafter %s, %d draft layers)",
            __version__, self.block_size, server_args.speculative_draft_model_path, len(self.drafter.layers),
        )

    def __getattr__(self, name):
        # Everything the scheduler asks that we do not define is the target worker's.
        if name == "_target_worker":
            raise AttributeError(name)
        return getattr(self._target_worker, name)

    # ------------------------------------------------------------------ lifecycle
    def alloc_memory_pool(self, memory_pool_config=None, req_to_token_pool=None, token_to_kv_pool_allocator=None):
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        slots = int(token_to_kv_pool_allocator.size) + 2 * int(token_to_kv_pool_allocator.page_size) + 1
        model = self.target_worker.model_runner.model
        vocab = self.target_worker.model_runner.model_config.vocab_size
        embed = model.get_input_embeddings()
        head = getattr(model, "lm_head", None) or embed

        def lm_head(hidden):
            # Parallel LM heads pad the vocabulary; padded rows must never win the argmax.
            return torch.nn.functional.linear(hidden.to(head.weight.dtype), head.weight[:vocab])

        requested = getattr(self.server_args, "speculative_draft_attention_backend", None)
        core = resolve_draft_attention_core(requested, self.device, self.drafter.fc.weight.dtype)
        logger.info("sglang-dflash: draft attention %s (--speculative-draft-attention-backend %s)", core, requested)
        self.runner = DraftRunner(self.drafter, slots, self.device, embed, lm_head, attention_core=core)

    def init_attention_backends(self):
        pass  # the drafter attends through its own core (draft_runner.py); nothing to build in SGLang

    def init_cuda_graphs(self):
        pass

    # ------------------------------------------------------------------ the step
    def forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None):
        if batch.forward_mode.is_extend() or batch.is_extend_in_batch:
            return self._prefill(batch, on_publish, pp_proxy_tensors)
        if batch.forward_mode.is_idle() or batch.batch_size() == 0:
            return self._idle(on_publish)
        return self._decode(batch, on_publish)

    def _prefill(self, batch, on_publish, pp_proxy_tensors):
        result = self.target_worker.forward_batch_generation(
            batch, pp_proxy_tensors=pp_proxy_tensors, capture_hidden_mode=CaptureHiddenMode.FULL
        )
        result.new_seq_lens = batch.seq_lens
        if on_publish is not None:
            on_publish(result.new_seq_lens)
        features = result.logits_output.hidden_states
        if features is None:
            raise RuntimeError("DFLASH prefill got no captured target hidden states")
        positions = torch.cat(
            [torch.arange(p, p + n, device=self.device) for p, n in zip(batch.prefix_lens, batch.extend_lens)]
        )
        self.runner.write_context(features, positions, batch.out_cache_loc.to(torch.int64))
        result.logits_output.hidden_states = None  # never copy them to the host
        result.next_draft_input = DraftState(bonus_tokens=result.next_token_ids, new_seq_lens=batch.seq_lens)
        return result

    def _idle(self, on_publish):
        state = DraftState.empty(self.device)
        if on_publish is not None:
            on_publish(state.new_seq_lens)
        return GenerationBatchResult(
            logits_output=None,
            next_token_ids=torch.empty((0,), dtype=torch.int64, device=self.device),
            accept_lens=torch.empty((0,), dtype=torch.int32, device=self.device),
            next_draft_input=state,
            can_run_cuda_graph=False,
            speculative_num_draft_tokens=self.block_size,
            new_seq_lens=state.new_seq_lens,
        )

    def _decode(self, batch, on_publish):
        state: DraftState = batch.spec_info
        width, bs = self.block_size, batch.batch_size()
        seq_lens = batch.seq_lens.to(torch.int64)  # committed lengths: the bonus is not in KV yet
        req_to_token = self.req_to_token_pool.req_to_token
        rows = batch.req_pool_indices.to(torch.int64)

        self.step_times.start_step()
        # 1. draft
        with self.step_times.phase("draft"):
            blocks, positions = self.runner.propose(
                state.bonus_tokens, seq_lens, req_to_token, rows, self.mask_token_id, width
            )
            block_slots = req_to_token[rows[:, None], positions].to(torch.int64)

        # 2. verify
        with self.step_times.phase("verify"):
            logits, features = self._verify(batch, blocks, positions, block_slots, seq_lens)

        with self.step_times.phase("accept_commit"):
            # 3. accept
            temperature, top_p, top_k = sampling_tensors(batch.sampling_info, bs, self.device)
            full_blocks = torch.full((bs,), width, dtype=torch.int64, device=self.device)
            logits = logits.view(bs, width, -1)
            accepted = self._accept(blocks, logits, full_blocks, temperature, top_p, top_k)
            if self.simulated_accept_len is not None:
                accepted = simulate_acceptance(blocks, logits, self.simulated_accept_len)
            accept_lens, kept = accepted.accept_lens, accepted.kept_rows

            # 4. commit
            self.runner.write_context(
                features.view(bs, width, -1)[kept], positions[kept], block_slots[kept]
            )
        self.step_times.end_step(bs, accept_lens)
        new_seq_lens = seq_lens + accept_lens
        if on_publish is not None:
            on_publish(new_seq_lens)
        bonus = accepted.emitted.gather(1, (accept_lens - 1)[:, None])[:, 0]
        return GenerationBatchResult(
            logits_output=None,
            next_token_ids=accepted.emitted.reshape(-1),
            accept_lens=accept_lens.to(torch.int32),
            next_draft_input=DraftState(bonus_tokens=bonus, new_seq_lens=new_seq_lens),
            can_run_cuda_graph=False,
            speculative_num_draft_tokens=width,
            new_seq_lens=new_seq_lens,
        )

    def _accept(self, blocks, logits, block_lens, temperature, top_p, top_k):
        """verify.py's rule: the CUDA block verifier on a GPU, its twin elsewhere (the same draws)."""
        bs, width = blocks.shape
        accept_uniforms = torch.rand(bs, width - 1, device=self.device)
        token_uniforms = torch.rand(bs, device=self.device)
        args = (blocks, logits, block_lens, temperature, top_p, top_k, accept_uniforms, token_uniforms)
        if blocks.is_cuda and not self._verifier_unavailable:
            try:
                return block_verify(*args)
            except KernelBuildError as error:
                logger.warning("sglang-dflash: %s; verifying with the PyTorch twin", error)
                self._verifier_unavailable = True
        return block_verify_reference(*args)

    def _verify(self, batch, blocks, positions, block_slots, seq_lens):
        """One TARGET_VERIFY forward over all blocks: logits and captured features of every row."""
        verify_input = BlockVerifyInput(
            draft_token=blocks.reshape(-1), positions=positions.reshape(-1), draft_token_num=self.block_size
        )
        batch.input_ids = verify_input.draft_token
        batch.spec_info = verify_input
        batch.out_cache_loc = block_slots.reshape(-1)
        batch.forward_mode = ForwardMode.TARGET_VERIFY
        runner = self.target_worker.model_runner
        forward_batch = ForwardBatch.init_new(
            batch, runner, capture_hidden_mode=CaptureHiddenMode.FULL, return_hidden_states_before_norm=False
        )
        # Attention metadata is planned by the model runner (the batch is not marked pre-planned).
        output = self.target_worker.forward_batch_generation(batch=None, forward_batch=forward_batch, is_verify=True)
        logits_output = output.logits_output
        return logits_output.next_token_logits.float(), logits_output.hidden_states


def sampling_tensors(sampling_info, bs: int, device):
    """Per-request temperature / top-p / top-k; SGLang marks greedy requests with top_k <= 1."""
    if sampling_info is None or sampling_info.is_all_greedy:
        zeros = torch.zeros(bs, device=device)
        return zeros, torch.ones(bs, device=device), torch.zeros(bs, dtype=torch.int64, device=device)
    top_k = sampling_info.top_ks.view(-1).to(torch.int64)
    temperature = sampling_info.temperatures.view(-1).float()
    temperature = torch.where(top_k <= 1, torch.zeros_like(temperature), temperature)
    vocab_wide = top_k >= (1 << 30)  # SGLang encodes "no top-k" as a huge k
    return temperature, sampling_info.top_ps.view(-1).float(), torch.where(vocab_wide, 0, top_k)


def load_checked_drafter(path, target_worker, block_size: int) -> DFlashDrafter:
    """Load our drafter and refuse, with a clear message, any pairing that cannot work."""
    if not path or not os.path.isdir(path):
        raise DFlashStartupError(f"--speculative-draft-model-path {path!r} is not a drafter directory")
    runner = target_worker.model_runner
    drafter = DFlashDrafter.from_pretrained(path, dtype=runner.model_config.dtype, device=runner.device)
    drafter.config.check_block_size(block_size)
    text_config = runner.model_config.hf_text_config
    drafter.config.check_target(
        text_config.hidden_size, text_config.num_hidden_layers, runner.model_config.vocab_size, runner.model_config.model_path
    )
    return drafter
