"""GPU kernels of sglang-dflash, each next to its plain-PyTorch twin (same signature, the CPU path).

  draft_attention  (Triton)    block queries over paged context K/V + the block's own K/V
                               twin: draft_attention_reference (the drafter's own mask and attention)
  block_verify     (CUDA C++)  accepted lengths, emitted tokens and kept KV rows for a batch of blocks
                               twin: block_verify_reference (verify.py's rule with explicit uniforms)

The dispatchers `draft_attention` and `block_verify` take the kernel for CUDA tensors and the twin
otherwise. Shipped as `sglang_dflash.kernels` from the repository's `kernels/` directory.
"""

from .block_verify import BlockVerifyOutput, block_verify, block_verify_cuda, block_verify_reference
from .draft_attention import draft_attention, draft_attention_reference, draft_attention_triton

__all__ = [
    "BlockVerifyOutput",
    "block_verify",
    "block_verify_cuda",
    "block_verify_reference",
    "draft_attention",
    "draft_attention_reference",
    "draft_attention_triton",
]
