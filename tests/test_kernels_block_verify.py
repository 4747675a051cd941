"""The block verifier: its twin is verify.py's rule, the CUDA source compiles, the kernel equals the twin.

CPU tests: the twin against `verify_block` (same random draws), the greedy-token path, the kept
rows, and the comparison catching a classic sampling bug. `nvcc -c` on block_verify.cu runs where
nvcc is on PATH (CI has nvcc 13). The kernel-vs-twin test needs a CUDA device (GPU test).
"""

from __future__ import annotations

import importlib
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

import sglang_dflash.kernels as kernels
from sglang_dflash.kernels import block_verify_reference
from sglang_dflash.kernels.block_verify import BlockVerifyOutput
from sglang_dflash.sampling import draw, probabilities
from sglang_dflash.verify import verify_block


def random_batch(generator, batch, width, vocab, logits_dtype=torch.float32, device="cpu", greedy_share=0.3):
    """Blocks whose drafts often agree with the target, so every acceptance length occurs.

    Logits are rounded to bf16 values, which makes ties common (the sort order must break them as
    the twin does). Sampling rows mix temperatures, top-k and top-p cuts.
    """
    logits = (torch.randn(batch, width, vocab, generator=generator) * 3).bfloat16().float()
    target_argmax = logits.argmax(-1)
    drafts = torch.randint(vocab, (batch, width), generator=generator)
    agree = torch.rand(batch, width, generator=generator) < 0.8
    block = torch.where(agree, torch.roll(target_argmax, 1, dims=1), drafts)
    block[:, 0] = torch.randint(vocab, (batch,), generator=generator)
    sampled = torch.rand(batch, generator=generator) >= greedy_share
    temperature = torch.where(sampled, torch.rand(batch, generator=generator) * 1.5 + 0.1, torch.zeros(batch))
    top_k = torch.where(torch.rand(batch, generator=generator) < 0.5, torch.randint(1, 50, (batch,), generator=generator), 0)
    top_p = torch.where(torch.rand(batch, generator=generator) < 0.5, torch.rand(batch, generator=generator) * 0.9 + 0.05,
                        torch.ones(batch))
    block_lens = torch.randint(1, width + 1, (batch,), generator=generator)
    block_lens[0] = width
    inputs = dict(
        block_tokens=block, target_logits=logits.to(logits_dtype), block_lens=block_lens, temperature=temperature,
        top_p=top_p, top_k=top_k, accept_uniforms=torch.rand(batch, width - 1, generator=generator),
        token_uniforms=torch.rand(batch, generator=generator),
    )
    return {k: v.to(device) for k, v in inputs.items()}


def assert_same_verify(result: BlockVerifyOutput, expected: BlockVerifyOutput) -> None:
    """Exact equality of lengths, emitted tokens (whole rows) and kept rows."""
    assert torch.equal(result.accept_lens.cpu(), expected.accept_lens.cpu()), "accept_lens differ"
    assert torch.equal(result.emitted.cpu(), expected.emitted.cpu()), "emitted tokens differ"
    assert torch.equal(result.kept_rows.cpu(), expected.kept_rows.cpu()), "kept rows differ"


def test_twin_is_verify_blocks_rule_with_its_draws():
    generator = torch.Generator().manual_seed(0)
    inputs = random_batch(generator, 64, 8, 40)
    draws = torch.Generator().manual_seed(5)
    expected = verify_block(
        inputs["block_tokens"], inputs["target_logits"], inputs["block_lens"], inputs["temperature"],
        inputs["top_p"], inputs["top_k"], generator=draws,
    )
    draws = torch.Generator().manual_seed(5)  # the same draws, in verify_block's order
    inputs["accept_uniforms"] = torch.rand(64, 7, generator=draws)
    inputs["token_uniforms"] = torch.rand(64, generator=draws)
    result = block_verify_reference(**inputs)
    assert torch.equal(result.accept_lens, expected.accept_lens) and torch.equal(result.emitted, expected.emitted)
    assert set(result.accept_lens.tolist()) >= {1, 8}, "the batch should cover short and full acceptance"
    columns = torch.arange(8)[None, :]
    assert torch.equal(result.kept_rows, columns < result.accept_lens[:, None])


def test_greedy_tokens_stand_in_for_logits():
    generator = torch.Generator().manual_seed(1)
    inputs = random_batch(generator, 16, 16, 30, greedy_share=1.0)
    from_logits = block_verify_reference(**inputs)
    target_tokens = inputs["target_logits"].argmax(-1)
    from_tokens = block_verify_reference(**{**inputs, "target_logits": None}, target_tokens=target_tokens)
    assert_same_verify(from_tokens, from_logits)


def test_dispatcher_runs_the_twin_on_cpu():
    inputs = random_batch(torch.Generator().manual_seed(2), 8, 4, 20)
    assert_same_verify(kernels.block_verify(**inputs), block_verify_reference(**inputs))


def _verify_forgetting_the_residual(block_tokens, target_logits, block_lens, temperature, top_p, top_k,
                                    accept_uniforms, token_uniforms, target_tokens=None):
    """A classic bug: after a rejection, draw from p instead of p without the rejected draft."""
    probs = probabilities(target_logits, temperature, top_p, top_k)
    drafts = block_tokens[:, 1:]
    draft_probs = probs[:, :-1].gather(-1, drafts[..., None])[..., 0]
    columns = torch.arange(1, block_tokens.shape[1])[None, :] < block_lens[:, None]
    kept = ((accept_uniforms < draft_probs) & columns).long().cumprod(1).sum(1)
    next_tokens = draw(probs[torch.arange(len(kept)), kept], token_uniforms)
    emitted = torch.roll(block_tokens, -1, dims=1).scatter(1, kept[:, None], next_tokens[:, None])
    return BlockVerifyOutput(kept + 1, emitted, torch.arange(block_tokens.shape[1])[None, :] < (kept + 1)[:, None])


def test_the_comparison_catches_a_verifier_that_forgets_the_residual():
    inputs = random_batch(torch.Generator().manual_seed(3), 256, 4, 8, greedy_share=0.0)
    with pytest.raises(AssertionError, match="emitted"):
        assert_same_verify(_verify_forgetting_the_residual(**inputs), block_verify_reference(**inputs))


def test_missing_toolchain_gives_a_clear_message(monkeypatch):
    # (the package's `block_verify` attribute is the dispatcher function, so go through importlib)
    module = importlib.import_module("sglang_dflash.kernels.block_verify")
    monkeypatch.setattr(module, "nvcc_path", lambda: None)
    module.load_extension.cache_clear()
    try:
        with pytest.raises(module.KernelBuildError, match="needs the CUDA toolkit"):
            module.load_extension()
    finally:
        module.load_extension.cache_clear()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_cuda_source_compiles_with_nvcc(tmp_path):
    source = Path(kernels.__file__).resolve().parent / "block_verify.cu"
    done = subprocess.run(
        ["nvcc", "-c", "-std=c++17", "-O3", "-gencode", "arch=compute_90,code=sm_90", str(source),
         "-o", str(tmp_path / "block_verify.o")],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "warning" not in done.stderr.lower(), done.stderr


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (GPU test)")
@pytest.mark.parametrize("logits_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("width,vocab", [(1, 50), (4, 1000), (16, 262144)])
def test_cuda_kernel_equals_its_twin(logits_dtype, width, vocab):
    """GPU only: built on first use, then exactly the twin's lengths, tokens and kept rows."""
    generator = torch.Generator().manual_seed(width * 7 + vocab)
    inputs = random_batch(generator, 32, width, vocab, logits_dtype=logits_dtype, device="cuda")
    expected = block_verify_reference(**inputs)
    assert_same_verify(kernels.block_verify_cuda(**inputs), expected)
    greedy = {**inputs, "temperature": torch.zeros_like(inputs["temperature"])}
    tokens = inputs["target_logits"].argmax(-1)
    assert_same_verify(kernels.block_verify_cuda(**{**greedy, "target_logits": None}, target_tokens=tokens),
                       block_verify_reference(**greedy))
