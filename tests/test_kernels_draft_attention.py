"""The Triton draft attention against its twin, and the twin against the drafter's own attention.

CPU: the kernel runs under Triton's interpreter. TRITON_INTERPRET=1 must be set before triton is
first imported (triton's own helpers are jitted at import), so one subprocess runs every case
through the kernel and the tests compare its outputs with the twin here, case by case.
The GPU test at the end needs a CUDA device and is skipped without one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sglang_dflash.config import DFlashConfig
from sglang_dflash.drafter import DFlashDrafter, DraftContext
from sglang_dflash.kernels import draft_attention_reference, draft_attention_triton

POOL_SLOTS = 2048


def make_case(generator, batch, block_len, heads, kv_heads, head_dim, context_lens, dtype, device="cpu"):
    """Random queries / block K/V, a paged pool, and req_to_token rows of scattered slot ids."""

    def randn(*shape):
        return torch.randn(*shape, generator=generator).to(dtype).to(device)

    rows = batch + 2  # a few rows no request uses
    width = max(context_lens) + block_len + 1
    slots = torch.randperm(POOL_SLOTS, generator=generator)[: rows * width].view(rows, width).to(torch.int32)
    return dict(
        queries=randn(batch, block_len, heads, head_dim),
        block_keys=randn(batch, block_len, kv_heads, head_dim),
        block_values=randn(batch, block_len, kv_heads, head_dim),
        key_pool=randn(POOL_SLOTS, kv_heads, head_dim),
        value_pool=randn(POOL_SLOTS, kv_heads, head_dim),
        req_to_token=slots.to(device),
        req_pool_indices=torch.randperm(rows, generator=generator)[:batch].to(device),
        context_lens=torch.tensor(context_lens, dtype=torch.int64, device=device),
    )


def reference_in_fp32(case, **kwargs):
    as_fp32 = {k: (v.float() if v.is_floating_point() else v) for k, v in case.items()}
    return draft_attention_reference(**as_fp32, **kwargs)


# block sizes 1..16, ragged contexts (empty ones too), windows shorter and longer than the
# contexts, causal and not, GQA 1/2/4/8, head dims 64 to 256 (80 is not a power of two), both dtypes
CASES = [
    # batch, B, heads, kv_heads, head_dim, context lens, window, causal, dtype, num_splits
    (2, 1, 4, 4, 64, [0, 9], None, False, torch.float16, None),
    (3, 16, 8, 2, 128, [130, 0, 47], None, False, torch.bfloat16, None),
    (3, 5, 8, 2, 80, [70, 3, 21], 16, False, torch.float16, None),
    (2, 16, 4, 1, 64, [200, 17], 16, True, torch.bfloat16, None),
    (1, 7, 2, 2, 256, [90], 8, False, torch.bfloat16, None),
    (2, 8, 8, 1, 96, [300, 150], None, False, torch.float16, 4),  # split context, combined after
    (3, 2, 4, 2, 64, [260, 0, 129], 100, True, torch.float16, 3),  # splits and a window together
]


OFF_BY_ONE_CASE = (2, 4, 4, 2, 64, [40, 25], 10, False, torch.float16, None)


def case_inputs(index, case):
    batch, block_len, heads, kv_heads, head_dim, lens, window, causal, dtype, splits = case
    generator = torch.Generator().manual_seed(1000 + index)
    return make_case(generator, batch, block_len, heads, kv_heads, head_dim, lens, dtype)


def run_interpreted(out_path: str) -> None:
    """Subprocess side: every case through the kernel under TRITON_INTERPRET=1."""
    assert os.environ.get("TRITON_INTERPRET") == "1"
    outputs = []
    for index, case in enumerate(CASES + [OFF_BY_ONE_CASE]):
        window, causal, splits = case[6], case[7], case[9]
        outputs.append(draft_attention_triton(**case_inputs(index, case), window=window, causal=causal, num_splits=splits))
    torch.save(outputs, out_path)


@pytest.fixture(scope="module")
def kernel_outputs(tmp_path_factory):
    out_path = tmp_path_factory.mktemp("interpreted") / "outputs.pt"
    here = Path(__file__).resolve().parent
    code = f"import sys; sys.path.insert(0, {str(here)!r}); import test_kernels_draft_attention as t; t.run_interpreted({str(out_path)!r})"
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(out_path)


@pytest.mark.parametrize("index", range(len(CASES)), ids=[f"B{c[1]}-D{c[4]}-g{c[2] // c[3]}-w{c[6]}-{'causal' if c[7] else 'full'}-{str(c[8])[6:]}-split{c[9]}" for c in CASES])
def test_triton_kernel_matches_its_twin(kernel_outputs, index):
    case = CASES[index]
    out = kernel_outputs[index]
    expected = reference_in_fp32(case_inputs(index, case), window=case[6], causal=case[7])
    assert out.dtype == case[8] and out.shape == expected.shape
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=2e-2)


def test_the_comparison_catches_a_window_off_by_one(kernel_outputs):
    """A twin with `<=` instead of `<` at the window edge must not pass for the kernel."""
    index = len(CASES)
    case = case_inputs(index, OFF_BY_ONE_CASE)
    out = kernel_outputs[index].float()
    torch.testing.assert_close(out, reference_in_fp32(case, window=10), atol=2e-2, rtol=2e-2)
    off_by_one = reference_in_fp32(case, window=11)  # sees one more key per query: |d| <= 10
    with pytest.raises(AssertionError):
        torch.testing.assert_close(out, off_by_one, atol=2e-2, rtol=2e-2)


def test_twin_reading_the_pool_equals_the_drafters_own_forward():
    """The drafter run with the twin as its attention core (context read from a paged pool through
    req_to_token, as in SGLang) gives the drafter's plain forward over per-request contexts."""
    config = DFlashConfig(
        hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        intermediate_size=96, rms_norm_eps=1e-6, vocab_size=50, block_size=8, mask_token_id=1,
        num_target_layers=4, target_layer_ids=[0, 2],
        layer_types=["sliding_attention", "full_attention", "sliding_attention"], sliding_window=9,
    )
    torch.manual_seed(0)
    drafter = DFlashDrafter(config).eval()
    lens, block_len = [13, 0, 5], 6
    slots_per_row = 32
    req_to_token = torch.randperm(4 * slots_per_row).view(4, slots_per_row)
    rows = torch.tensor([2, 0, 3])
    pool_k = [torch.zeros(4 * slots_per_row, 2, 16) for _ in range(3)]
    pool_v = [torch.zeros_like(k) for k in pool_k]
    contexts = []
    for row, n in zip(rows.tolist(), lens):
        context = DraftContext()
        if n:
            features, positions = torch.randn(n, config.num_context_features), torch.arange(n)
            keys_values = drafter.context_keys_values(features, positions)
            context.append(keys_values, positions)
            for layer, (k, v) in enumerate(keys_values):
                pool_k[layer][req_to_token[row, :n]] = k
                pool_v[layer][req_to_token[row, :n]] = v
        contexts.append(context)
    context_lens = torch.tensor(lens)
    positions = context_lens[:, None] + torch.arange(block_len)[None, :]
    block = torch.randn(3, block_len, 64)

    def core(layer, attn, queries, block_keys, block_values):
        return draft_attention_reference(
            queries, block_keys, block_values, pool_k[layer], pool_v[layer], req_to_token, rows, context_lens,
            window=attn.window, causal=attn.causal,
        )

    with torch.no_grad():
        paged = drafter.forward_with_attention(block, positions, core)
        plain = drafter(block, positions, contexts)
    torch.testing.assert_close(paged, plain, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (GPU test)")
@pytest.mark.parametrize("window", [None, 2048])
def test_triton_kernel_on_gpu_matches_its_twin_at_drafter_shapes(window):
    """GPU only: the gemma-4-26B-A4B drafter's attention shapes (32 heads x 128, 8 KV heads), block 16."""
    generator = torch.Generator().manual_seed(1)
    case = make_case(generator, 4, 16, 32, 8, 128, [3000, 1, 700, 4095], torch.bfloat16, device="cuda")
    case["key_pool"] = torch.randn(POOL_SLOTS * 4, 8, 128, device="cuda").bfloat16()
    case["value_pool"] = torch.randn_like(case["key_pool"])
    case["req_to_token"] = torch.randperm(POOL_SLOTS * 4, device="cuda")[: 6 * 4200].view(6, 4200).int()
    out = draft_attention_triton(**case, window=window)
    torch.testing.assert_close(out.float(), reference_in_fp32(case, window=window), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("dtype,window,split", [("bf16", True, False), ("fp16", False, True)])
def test_triton_kernel_compiles_for_hopper_without_a_gpu(dtype, window, split):
    """Ahead-of-time compile to an sm_90 cubin (triton bundles ptxas): catches what the interpreter
    cannot (types, layouts, shared memory) at the gemma-4 drafter's shapes (B 16, 4 heads per KV head, D 128)."""
    import inspect

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from sglang_dflash.kernels.draft_attention import _draft_attention_kernel

    pointer = "*" + dtype
    types = dict(Q=pointer, BK=pointer, BV=pointer, KPool=pointer, VPool=pointer, Out=pointer, ReqToToken="*i32",
                 ReqIdx="*i64", CtxLens="*i64", PartialOut="*fp32", PartialLse="*fp32", scale_log2="fp32")
    constexprs = dict(BLOCK_LEN=16, GROUP=4, HEAD_DIM=128, BLOCK_M=64, BLOCK_N=64, BLOCK_B=16, BLOCK_D=128,
                      HAS_WINDOW=window, CAUSAL=False, SPLIT=split, DOT_FP32=False)
    names = list(inspect.signature(_draft_attention_kernel.fn).parameters)
    signature = {name: "constexpr" if name in constexprs else types.get(name, "i32") for name in names}
    source = ASTSource(fn=_draft_attention_kernel, signature=signature,
                       constexprs={(names.index(k),): v for k, v in constexprs.items()})
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8, "num_stages": 2})
    assert len(compiled.asm["cubin"]) > 0
    assert compiled.metadata.shared <= 228 * 1024  # fits an H100/H200 SM
