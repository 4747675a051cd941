"""Mean acceptance length of a drafter on the benchmark sets, measured with the reference decoder.

  python -m sglang_dflash.train.acceptance --drafter DIR [--num-prompts 32] [--max-new-tokens 256] [--server]

For each set, the first N rows' first user turn goes through the target's chat template and is
decoded greedily (float32 by default). The acceptance length of a verify step is the number of
tokens it commits, the target's own token included; a set's figure is the mean over all its
verify steps (committed tokens / verify steps, as SGLang's `spec_accept_length` counts them).

By default the reference decoder runs (the target at batch 1: exact, but slow on a CPU). With
--server a real SGLang DFLASH server with our worker decodes each set's prompts concurrently on
127.0.0.1, and a set's figure is its completion tokens over its verify steps (SGLang's
`spec_verify_ct`; the prefill's first token counts as committed, as in `spec_accept_length`), in
--dtype (on this project's CPU bfloat16 was no faster than float32: the server's per-request
overhead dominates there).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from ..config import DFlashConfig
from ..drafter import DFlashDrafter
from ..generate import DTYPES, encode, stop_ids
from ..reference import ReferenceDecoder
from ..targets import TargetModel, load_tokenizer

DATASETS = ("math500", "gsm8k", "humaneval", "mbpp", "mt-bench")
SHARED_DATASETS = Path(__file__).resolve().parents[3] / ".." / "shared" / "datasets"
PROJECT_DATASETS = Path(__file__).resolve().parents[3] / "benchmarks" / "data"


def dataset_file(directory: Path | None, name: str) -> Path:
    candidates = [directory] if directory else [PROJECT_DATASETS, SHARED_DATASETS]
    for folder in candidates:
        if (Path(folder) / f"{name}.jsonl").exists():
            return Path(folder) / f"{name}.jsonl"
    raise FileNotFoundError(f"{name}.jsonl not found in {', '.join(map(str, candidates))}")


def first_turns(path: Path, count: int) -> list[str]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [row["turns"][0] for row in rows[:count]]


def measure(decoder: ReferenceDecoder, prompts: list[list[int]], max_new_tokens: int, stops, batch: int, bar) -> dict:
    steps, committed, outputs = 0, 0, 0
    histogram = [0] * (decoder.block_size + 1)
    for start in range(0, len(prompts), batch):
        for generation in decoder.generate(prompts[start : start + batch], max_new_tokens, stop_token_ids=stops):
            steps += len(generation.acceptance_lengths)
            committed += sum(generation.acceptance_lengths)
            outputs += len(generation.output_ids)
            for length in generation.acceptance_lengths:
                histogram[length] += 1
        bar.update(min(batch, len(prompts) - start))
    return {"prompts": len(prompts), "output_tokens": outputs, "verify_steps": steps,
            "mean_acceptance_length": committed / steps if steps else 0.0, "histogram": histogram}


def measure_on_server(server, prompts: list[list[int]], max_new_tokens: int, bar) -> dict:
    """Greedy /generate requests for all `prompts` at once; acceptance from SGLang's own counters."""
    from concurrent.futures import ThreadPoolExecutor

    def one(ids: list[int]) -> dict:
        answer = server.post("/generate", {"input_ids": ids, "sampling_params": {
            "temperature": 0.0, "max_new_tokens": max_new_tokens}}, timeout=3600)  # fmt: skip
        bar.update(1)
        return answer["meta_info"]

    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        metas = list(pool.map(one, prompts))
    outputs = sum(int(m["completion_tokens"]) for m in metas)
    steps = sum(int(m.get("spec_verify_ct") or 0) for m in metas)
    if steps == 0:
        raise RuntimeError("the server reported no verify steps: it is not speculating")
    return {"prompts": len(prompts), "output_tokens": outputs, "verify_steps": steps,
            "mean_acceptance_length": outputs / steps}


def measure_all_on_server(args, sets: dict[str, list[list[int]]], block: int) -> dict:
    from ..demo import dflash_server_args
    from ..launch import launch_server
    from ..targets import smollm2_hf_dir

    target = smollm2_hf_dir() if args.target == "smollm2" else args.target
    concurrency = max(map(len, sets.values()))
    flags = dflash_server_args(args.drafter, block) + [
        "--max-running-requests", str(concurrency), "--max-total-tokens", "32768", "--dtype", args.dtype]
    results = {}
    with launch_server(target, flags, timeout=900) as server:
        with tqdm(total=sum(map(len, sets.values())), desc="acceptance (server)", unit="prompt") as bar:
            for name, prompts in sets.items():
                bar.set_postfix(set=name)
                results[name] = measure_on_server(server, prompts, args.max_new_tokens, bar)
                bar.write(f"{name}: {results[name]['mean_acceptance_length']:.2f} "
                          f"({results[name]['output_tokens']} tokens, {results[name]['verify_steps']} verify steps)")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drafter", required=True)
    parser.add_argument("--target", default="smollm2")
    parser.add_argument("--datasets", default=",".join(DATASETS))
    parser.add_argument("--datasets-dir", type=Path, default=None)
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--block-size", type=int, default=None)
    parser.add_argument("--batch", type=int, default=8, help="prompts decoded together")
    parser.add_argument("--dtype", choices=DTYPES, default="float32")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    parser.add_argument("--server", action="store_true",
                        help="decode on a real SGLang DFLASH server with our worker (each set's prompts concurrently)")
    args = parser.parse_args(argv)

    tokenizer = load_tokenizer(args.target)
    names = [n.strip() for n in args.datasets.split(",") if n.strip()]
    sets = {n: [encode(tokenizer, p, chat=True) for p in first_turns(dataset_file(args.datasets_dir, n), args.num_prompts)]
            for n in names}
    if args.server:
        block_size = args.block_size or DFlashConfig.from_pretrained(args.drafter).block_size
        results = measure_all_on_server(args, sets, block_size)
    else:
        dtype = DTYPES[args.dtype]
        target = TargetModel.from_pretrained(args.target, dtype=dtype)
        decoder = ReferenceDecoder(target, DFlashDrafter.from_pretrained(args.drafter, dtype=dtype), args.block_size)
        block_size = decoder.block_size
        stops = stop_ids(tokenizer, target)
        results = {}
        with tqdm(total=sum(map(len, sets.values())), desc="acceptance", unit="prompt") as bar:
            for name, prompts in sets.items():
                bar.set_postfix(set=name)
                results[name] = measure(decoder, prompts, args.max_new_tokens, stops, args.batch, bar)
    mean = sum(r["mean_acceptance_length"] for r in results.values()) / len(results)
    print(f"\n| set | prompts | output tokens | verify steps | mean acceptance length |\n|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['prompts']} | {r['output_tokens']} | {r['verify_steps']} | {r['mean_acceptance_length']:.2f} |")
    print(f"| average of sets | | | | {mean:.2f} |")
    if args.out:
        report = {"drafter": str(args.drafter), "max_new_tokens": args.max_new_tokens, "dtype": args.dtype,
                  "block_size": block_size, "decoder": "sglang server" if args.server else "reference",
                  "sets": results, "average": mean}
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    sys.exit(main())
