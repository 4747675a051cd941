"""Command line over the reference decoder.

  python -m sglang_dflash.generate --target smollm2 --drafter DIR --prompt "Hi" --chat \\
      --max-new-tokens 64 --temperature 0 --json --compare-ar

--target takes a model directory, a .gguf file, or `smollm2` (the packaged SmolLM2-135M-Instruct).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from .drafter import DFlashDrafter
from .reference import ReferenceDecoder, generate_autoregressive
from .sampling import SamplingParams
from .targets import TargetModel, load_tokenizer

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sglang_dflash.generate", description="DFlash speculative decoding with the reference decoder."
    )
    parser.add_argument("--target", default="smollm2", help="model directory, .gguf file or `smollm2` (default)")
    parser.add_argument("--drafter", required=True, help="DFlash drafter directory (z-lab format)")
    parser.add_argument("--prompt", required=True, action="append", help="prompt text; repeat for a batch")
    parser.add_argument("--chat", action="store_true", help="wrap each prompt in the target's chat template")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--block-size", type=int, default=None, help="default: the drafter's trained block size")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument("--compare-ar", action="store_true", help="also run target-only decoding and compare")
    return parser


def encode(tokenizer, prompt: str, chat: bool) -> list[int]:
    if chat:
        encoded = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
        return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)
    return tokenizer(prompt)["input_ids"]


def stop_ids(tokenizer, target: TargetModel) -> list[int]:
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    eos = getattr(target.model.generation_config, "eos_token_id", None)
    ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    return sorted(ids)


def run(args: argparse.Namespace) -> dict:
    dtype = DTYPES[args.dtype]
    tokenizer = load_tokenizer(args.target)
    target = TargetModel.from_pretrained(args.target, dtype=dtype)
    drafter = DFlashDrafter.from_pretrained(args.drafter, dtype=dtype)
    decoder = ReferenceDecoder(target, drafter, block_size=args.block_size)
    prompts = [encode(tokenizer, text, args.chat) for text in args.prompt]
    sampling = SamplingParams(args.temperature, args.top_p, args.top_k)
    stops = stop_ids(tokenizer, target)

    started = time.perf_counter()
    generations = decoder.generate(prompts, args.max_new_tokens, sampling, stops, seed=args.seed)
    seconds = time.perf_counter() - started
    rows = []
    for generation in generations:
        rows.append(
            {
                "output_ids": generation.output_ids,
                "text": tokenizer.decode(generation.output_ids, skip_special_tokens=True),
                "acceptance_lengths": generation.acceptance_lengths,
                "mean_acceptance_length": round(generation.mean_acceptance_length, 3),
                "finish_reason": generation.finish_reason,
            }
        )
    report = {"block_size": decoder.block_size, "seconds": round(seconds, 3)}
    new_tokens = sum(len(g.output_ids) for g in generations)
    report["tokens_per_second"] = round(new_tokens / seconds, 2)
    if args.compare_ar:
        started = time.perf_counter()
        baseline = generate_autoregressive(target, prompts, args.max_new_tokens, sampling, stops, seed=args.seed)
        ar_seconds = time.perf_counter() - started
        report["ar_seconds"] = round(ar_seconds, 3)
        report["ar_tokens_per_second"] = round(sum(len(g.output_ids) for g in baseline) / ar_seconds, 2)
        for row, reference in zip(rows, baseline):
            row["ar_output_ids"] = reference.output_ids
            row["identical"] = row["output_ids"] == reference.output_ids
    # A single prompt prints a flat object; a batch nests one object per prompt under "results".
    return {**rows[0], **report} if len(rows) == 1 else {"results": rows, **report}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        report = run(args)
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report))
        return 0
    for row in report.get("results", [report]):
        print(row["text"])
        print(
            f"-- {len(row['output_ids'])} tokens, mean acceptance length {row['mean_acceptance_length']:.2f} "
            f"over {len(row['acceptance_lengths'])} verify steps ({row['finish_reason']})"
        )
        if "identical" in row:
            print(f"-- identical to target-only decoding: {row['identical']}")
    print(f"-- {report['tokens_per_second']} tok/s (block size {report['block_size']})", end="")
    if "ar_tokens_per_second" in report:
        print(f"; target-only {report['ar_tokens_per_second']} tok/s", end="")
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
