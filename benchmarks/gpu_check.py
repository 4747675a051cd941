"""Kernels on a GPU: each against its twin, then timed against the twin and SGLang's own path.

Shapes are the gemma-4-26B-A4B drafter's (hidden 2816, 32 heads x 128, 8 KV heads, bf16, block 16,
4 sliding layers with window 2048 + 1 full layer; vocabulary 262144), at batch 1/8/32 and context
1k/8k/32k. Three tables:
  draft attention : ours (Triton) | twin (torch) | SGLang's FA4 kernel (where the GPU has it)
  drafter pass    : the 5-layer drafter over a block, with our Triton core | with the twin
  block verifier  : ours (CUDA) | twin (torch) | SGLang's greedy / sampling accept
and a JSON file with every number. `--tiny --device cpu` runs the same code at toy sizes
(the twin alone where a kernel needs a GPU), so the script can be checked without one.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from types import SimpleNamespace

import torch

from sglang_dflash.config import DFlashConfig
from sglang_dflash.drafter import DFlashDrafter
from sglang_dflash.kernels import block_verify_cuda, block_verify_reference, draft_attention_reference, draft_attention_triton

GEMMA4_DRAFTER = dict(
    hidden_size=2816, num_hidden_layers=5, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
    intermediate_size=5632, rms_norm_eps=1e-6, num_target_layers=30, target_layer_ids=[1, 6, 11, 17, 22, 27],
    block_size=16, mask_token_id=4, sliding_window=2048, rope_theta=1e6, max_position_embeddings=262144,
    layer_types=["sliding_attention"] * 4 + ["full_attention"],
)
TINY_DRAFTER = dict(GEMMA4_DRAFTER, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    intermediate_size=96, sliding_window=24, block_size=4)


def timed(fn, device, repeats: int) -> float:
    """Median milliseconds of `fn()` (after one warm-up call that also compiles)."""
    fn()
    samples = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            samples.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
    return sorted(samples)[len(samples) // 2]


def attention_inputs(batch, context, block, heads, kv_heads, head_dim, device, dtype, generator):
    """Random inputs made on the device itself (host-side randn of the big pools would dominate)."""
    width = context + block
    slots = batch * width + 1

    def randn(*shape):
        return torch.randn(*shape, generator=generator, device=device).to(dtype)

    return dict(
        queries=randn(batch, block, heads, head_dim),
        block_keys=randn(batch, block, kv_heads, head_dim),
        block_values=randn(batch, block, kv_heads, head_dim),
        key_pool=randn(slots, kv_heads, head_dim),
        value_pool=randn(slots, kv_heads, head_dim),
        req_to_token=torch.randperm(slots, generator=generator, device=device)[: batch * width]
        .view(batch, width).to(torch.int32),
        req_pool_indices=torch.arange(batch, device=device),
        context_lens=torch.full((batch,), context, dtype=torch.int64, device=device),
    )


def sglang_fa4_attention(device):
    """SGLang's FA4 kernel behind the twin's signature, or None with the reason."""
    if device.type != "cuda":
        return None, "needs a GPU"
    from sglang_dflash.sglang.draft_runner import fa4_available, fa4_draft_attention

    if not fa4_available(device):
        return None, "FA4 not available on this GPU / build"
    return fa4_draft_attention, ""


def check_attention(args, device, results):
    generator = torch.Generator(device=device).manual_seed(0)
    cfg = TINY_DRAFTER if args.tiny else GEMMA4_DRAFTER
    heads, kv_heads, head_dim = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    fa4, fa4_reason = sglang_fa4_attention(device)
    rows = []
    for window in (None, cfg["sliding_window"]):
        for batch in args.batches:
            for context in args.contexts:
                inputs = attention_inputs(batch, context, args.block, heads, kv_heads, head_dim, device, torch.bfloat16,
                                          generator)
                kwargs = dict(window=window, max_context_len=context)
                row = dict(kernel="draft_attention", window=window, batch=batch, context=context)
                expected = draft_attention_reference(**inputs, **kwargs)
                row["twin_ms"] = timed(lambda: draft_attention_reference(**inputs, **kwargs), device, args.repeats)
                if device.type == "cuda":
                    out = draft_attention_triton(**inputs, **kwargs)
                    row["max_abs_error"] = float((out.float() - expected.float()).abs().max())
                    row["ours_ms"] = timed(lambda: draft_attention_triton(**inputs, **kwargs), device, args.repeats)
                if fa4 is not None:
                    try:
                        fa4_out = fa4(**{**inputs, "key_pool": inputs["key_pool"].clone(),
                                         "value_pool": inputs["value_pool"].clone()}, **kwargs)
                        row["sglang_fa4_max_abs_error"] = float((fa4_out.float() - expected.float()).abs().max())
                        row["sglang_fa4_ms"] = timed(lambda: fa4(**inputs, **kwargs), device, args.repeats)
                    except Exception as error:  # report, keep measuring the rest
                        row["sglang_fa4"] = f"failed: {type(error).__name__}: {str(error)[:200]}"
                else:
                    row["sglang_fa4"] = fa4_reason
                rows.append(row)
                print_row(row)
                del inputs, expected
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    results["draft_attention"] = rows


def check_drafter_pass(args, device, results):
    """The whole drafter over a block, attention through our kernel vs the twin, context in a pool."""
    cfg = TINY_DRAFTER if args.tiny else GEMMA4_DRAFTER
    config = DFlashConfig(**cfg)
    torch.manual_seed(0)
    drafter = DFlashDrafter(config).to(device, torch.bfloat16).eval()
    generator = torch.Generator(device=device).manual_seed(1)
    rows = []
    for batch in args.batches:
        for context in args.contexts:
            inputs = attention_inputs(batch, context, args.block, config.num_attention_heads,
                                      config.num_key_value_heads, config.head_dim, device, torch.bfloat16, generator)
            pools = [(inputs["key_pool"], inputs["value_pool"])] * config.num_hidden_layers
            block = torch.randn(batch, args.block, config.hidden_size, generator=generator, device=device).bfloat16()
            positions = inputs["context_lens"][:, None] + torch.arange(args.block, device=device)[None, :]

            def run(attention):
                def core(layer, attn, q, k, v):
                    return attention(q, k, v, *pools[layer], inputs["req_to_token"], inputs["req_pool_indices"],
                                     inputs["context_lens"], window=attn.window, causal=attn.causal,
                                     max_context_len=context)

                with torch.inference_mode():
                    return drafter.forward_with_attention(block, positions, core)

            row = dict(kernel="drafter_pass", batch=batch, context=context)
            row["twin_ms"] = timed(lambda: run(draft_attention_reference), device, args.repeats)
            if device.type == "cuda":
                ours, twin = run(draft_attention_triton).float(), run(draft_attention_reference).float()
                row["max_rel_error"] = float((ours - twin).abs().max() / twin.abs().max())  # 5 bf16 layers deep
                row["ours_ms"] = timed(lambda: run(draft_attention_triton), device, args.repeats)
            rows.append(row)
            print_row(row)
            del inputs, pools
    results["drafter_pass"] = rows


def verify_inputs(batch, block, vocab, device, mode, generator):
    def rand(*shape):
        return torch.rand(*shape, generator=generator, device=device)

    logits = torch.randn(batch, block, vocab, generator=generator, device=device) * 4
    argmax = logits.argmax(-1)
    others = torch.randint(vocab, (batch, block), generator=generator, device=device)
    tokens = torch.where(rand(batch, block) < 0.85, torch.roll(argmax, 1, dims=1), others)
    sampled = mode != "greedy"
    full = lambda value, dtype=torch.float32: torch.full((batch,), value, dtype=dtype, device=device)  # noqa: E731
    return dict(
        block_tokens=tokens, target_logits=logits, block_lens=full(block, torch.int64),
        temperature=full(0.8 if sampled else 0.0), top_p=full(0.95 if mode == "top_p" else 1.0),
        top_k=full(50 if mode == "top_k" else 0, torch.int64),
        accept_uniforms=rand(batch, block - 1), token_uniforms=rand(batch),
    )


def sglang_accept(inputs, mode):
    """SGLang 0.5.23's own accept step for the same blocks (its own random draws when sampling)."""
    blocks, logits = inputs["block_tokens"], inputs["target_logits"]
    bs, width = blocks.shape
    if mode == "greedy":
        from sglang.kernels.ops.speculative.dflash import compute_dflash_correct_drafts_and_bonus

        return compute_dflash_correct_drafts_and_bonus(candidates=blocks, target_predict=logits.argmax(-1))
    from sglang.srt.speculative.dflash_utils import compute_dflash_sampling_correct_drafts_and_bonus

    info = SimpleNamespace(
        temperatures=inputs["temperature"][:, None], top_ps=inputs["top_p"],
        top_ks=torch.where(inputs["top_k"] > 0, inputs["top_k"], logits.shape[-1]).to(torch.int32),
        need_top_k_sampling=mode == "top_k", need_top_p_sampling=mode == "top_p",
    )
    return compute_dflash_sampling_correct_drafts_and_bonus(
        candidates=blocks, next_token_logits=logits.reshape(bs * width, -1), sampling_info=info
    )


def check_verifier(args, device, results):
    generator = torch.Generator(device=device).manual_seed(2)
    vocab = 1000 if args.tiny else 262144
    rows = []
    for mode in ("greedy", "sampling", "top_k", "top_p"):
        for batch in args.batches:
            inputs = verify_inputs(batch, args.block, vocab, device, mode, generator)
            row = dict(kernel="block_verify", mode=mode, batch=batch, vocab=vocab)
            expected = block_verify_reference(**inputs)
            row["twin_ms"] = timed(lambda: block_verify_reference(**inputs), device, args.repeats)
            row["mean_accept_len"] = float(expected.accept_lens.float().mean())
            if device.type == "cuda":
                out = block_verify_cuda(**inputs)
                row["identical_to_twin"] = bool(
                    torch.equal(out.accept_lens, expected.accept_lens) and torch.equal(out.emitted, expected.emitted)
                    and torch.equal(out.kept_rows, expected.kept_rows)
                )
                row["ours_ms"] = timed(lambda: block_verify_cuda(**inputs), device, args.repeats)
                try:
                    sglang_accept(inputs, mode)
                    row["sglang_ms"] = timed(lambda: sglang_accept(inputs, mode), device, args.repeats)
                except Exception as error:
                    row["sglang"] = f"failed: {type(error).__name__}: {str(error)[:200]}"
            rows.append(row)
            print_row(row)
    results["block_verify"] = rows


def print_row(row: dict) -> None:
    cells = []
    for key, value in row.items():
        if isinstance(value, float) and not math.isnan(value):
            value = f"{value:.4g}"
        cells.append(f"{key}={value}")
    print("  ".join(cells), flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tiny", action="store_true", help="toy sizes (for a CPU smoke run)")
    parser.add_argument("--out", default="gpu_check.json")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--only", choices=["attention", "drafter", "verify"], action="append")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    args.block = 4 if args.tiny else 16
    args.batches = [1, 2] if args.tiny else [1, 8, 32]
    args.contexts = [40, 100] if args.tiny else [1024, 8192, 32768]
    if args.tiny:
        args.repeats = min(args.repeats, 2)
    results = dict(device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                   torch=torch.__version__, block=args.block)
    sections = {"attention": check_attention, "drafter": check_drafter_pass, "verify": check_verifier}
    for name in args.only or list(sections):
        print(f"== {name}", flush=True)
        sections[name](args, device, results)
    failures = [row for row in results.get("draft_attention", []) if row.get("max_abs_error", 0.0) > 5e-2]
    failures += [row for row in results.get("drafter_pass", []) if row.get("max_rel_error", 0.0) > 3e-2]
    failures += [row for row in results.get("block_verify", []) if row.get("identical_to_twin") is False]
    results["failures"] = failures
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    print(f"wrote {args.out}; {len(failures)} kernel/twin mismatches", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
