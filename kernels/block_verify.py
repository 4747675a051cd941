"""Block verifier: the acceptance rule for a batch of blocks in one CUDA launch, no tree.

From each request's block `[anchor, d1, ..., d_{B-1}]`, the target's verify logits (or its greedy
tokens), its sampling parameters and explicit uniforms, it returns how many tokens the request
emits this step (`accept_lens` = kept drafts + 1), the tokens (`emitted`, first accept_lens[i] of
row i) and which block rows keep their target KV (`kept_rows`: the anchor and the kept drafts).

`block_verify_reference` is the twin and the CPU path: it *is* verify.py's rule
(`verify_block_with_uniforms`), so there is one definition of acceptance. The CUDA kernel
(block_verify.cu) is built on first use with torch.utils.cpp_extension and cached by torch.
"""

from __future__ import annotations

import functools
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from sglang_dflash.verify import verify_block_with_uniforms

SOURCE_DIR = Path(__file__).resolve().parent
SOURCES = [SOURCE_DIR / "block_verify_binding.cpp", SOURCE_DIR / "block_verify.cu"]
EXTENSION_NAME = "sglang_dflash_block_verify"


class KernelBuildError(RuntimeError):
    """The CUDA verifier cannot be built here (no CUDA toolchain, or the build failed)."""


@dataclass
class BlockVerifyOutput:
    accept_lens: torch.Tensor  # [bs] int64: kept drafts + the target's own token
    emitted: torch.Tensor  # [bs, B] int64: first accept_lens[i] entries are the tokens to emit
    kept_rows: torch.Tensor  # [bs, B] bool: block rows whose target KV stays (row < accept_len)


def block_verify_reference(
    block_tokens: torch.Tensor,  # [bs, B] int64: anchor then drafts
    target_logits: torch.Tensor | None,  # [bs, B, V] (float32/fp16/bf16), None if greedy tokens suffice
    block_lens: torch.Tensor,  # [bs] int64: columns of the block that count (<= B)
    temperature: torch.Tensor,  # [bs] float32, 0 = greedy
    top_p: torch.Tensor,  # [bs] float32
    top_k: torch.Tensor,  # [bs] int64, 0 = no cut
    accept_uniforms: torch.Tensor,  # [bs, B-1] float32 in [0, 1)
    token_uniforms: torch.Tensor,  # [bs] float32 in [0, 1)
    target_tokens: torch.Tensor | None = None,  # [bs, B] int64: the target's argmax, if known
) -> BlockVerifyOutput:
    result = verify_block_with_uniforms(
        block_tokens, target_logits, block_lens, temperature, top_p, top_k, accept_uniforms, token_uniforms,
        target_tokens=target_tokens,
    )
    columns = torch.arange(block_tokens.shape[1], device=block_tokens.device)
    return BlockVerifyOutput(result.accept_lens, result.emitted, columns[None, :] < result.accept_lens[:, None])


def nvcc_path() -> str | None:
    from torch.utils.cpp_extension import CUDA_HOME

    if CUDA_HOME and (Path(CUDA_HOME) / "bin" / "nvcc").exists():
        return str(Path(CUDA_HOME) / "bin" / "nvcc")
    return shutil.which("nvcc")


def cuda_toolkit_dir() -> Path | None:
    """The toolkit holding cuda_runtime.h when torch's CUDA_HOME guess lacks it.

    torch derives CUDA_HOME from nvcc's location, so an nvcc in /usr/local/bin gives /usr/local,
    whose include/ has no CUDA headers; the toolkit itself is usually /usr/local/cuda.
    """
    from torch.utils.cpp_extension import CUDA_HOME

    if CUDA_HOME and (Path(CUDA_HOME) / "include" / "cuda_runtime.h").exists():
        return None
    for candidate in (Path("/usr/local/cuda"), *sorted(Path("/usr/local").glob("cuda-*"), reverse=True)):
        if (candidate / "include" / "cuda_runtime.h").exists():
            return candidate
    return None


@functools.cache
def load_extension():
    """Build (first call, about a minute) or load (cached by torch) the CUDA verifier."""
    if nvcc_path() is None:
        raise KernelBuildError(
            "the CUDA block verifier is compiled on first use and needs the CUDA toolkit (nvcc on PATH or "
            "CUDA_HOME set); none was found. Install the toolkit matching torch "
            f"(CUDA {torch.version.cuda}) or use sglang_dflash.kernels.block_verify_reference."
        )
    from torch.utils.cpp_extension import load

    toolkit = cuda_toolkit_dir()
    try:
        return load(
            name=EXTENSION_NAME,
            sources=[str(s) for s in SOURCES],
            extra_cflags=["-O3"],  # torch chooses the C++ standard its headers need (C++20)
            extra_cuda_cflags=["-O3"],
            extra_include_paths=[str(toolkit / "include")] if toolkit else None,
            extra_ldflags=[f"-L{toolkit / 'lib64'}"] if toolkit else None,
            verbose=False,
        )
    except Exception as error:  # the compiler's own message is in `error`
        raise KernelBuildError(f"building the CUDA block verifier from {SOURCE_DIR} failed: {error}") from error


def block_verify_cuda(
    block_tokens, target_logits, block_lens, temperature, top_p, top_k, accept_uniforms, token_uniforms,
    target_tokens=None,
) -> BlockVerifyOutput:
    """The CUDA kernel; same signature and result as `block_verify_reference`."""
    if target_logits is None and bool((temperature > 0).any()):
        raise ValueError("block_verify: sampled requests need target_logits")
    accept_lens, emitted, kept_rows = load_extension().block_verify(
        block_tokens, target_logits, target_tokens, block_lens, temperature.float(), top_p.float(),
        top_k.to(torch.int64), accept_uniforms.float(), token_uniforms.float(),
    )
    return BlockVerifyOutput(accept_lens, emitted, kept_rows)


def block_verify(*args, **kwargs) -> BlockVerifyOutput:
    """The kernel for CUDA tensors, the twin elsewhere (same signature as the twin)."""
    block_tokens = args[0] if args else kwargs["block_tokens"]
    if block_tokens.is_cuda:
        return block_verify_cuda(*args, **kwargs)
    return block_verify_reference(*args, **kwargs)
