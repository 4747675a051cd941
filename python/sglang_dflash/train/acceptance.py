"""Mean acceptance length of a drafter on the benchmark sets, at temperature 0.

  python -m sglang_dflash.train.acceptance --drafter DIR [--num-prompts 32] [--max-new-tokens 256] [--server]

For each set, the first N rows' first user turn goes through the target's chat template and is
decoded greedily (float32 by default). The acceptance length of a verify step is the number of
tokens it commits, the target's own token included; a set's figure is the mean over all its
verify steps: (output tokens - one prefill token per prompt) / verify steps. Both decoders count
it that way, so their figures for the same prompts agree (SGLang's own `spec_accept_length` also
counts the prefill's token, which raises it by 1/steps per request).

By default the reference decoder runs (--batch prompts at a time: exact, but slow on a CPU). With
--server a real SGLang DFLASH server with our worker decodes each set's prompts concurrently on
127.0.0.1 and the verify steps are SGLang's `spec_verify_ct`, in --dtype (on this project's CPU
bfloat16 was no faster than float32: the server's per-request overhead dominates there).
--out is rewritten after every set, so a stopped run keeps the sets it finished.
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import contextmanager
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
    steps, outputs = 0, 0
    histogram = [0] * (decoder.block_size + 1)
    for start in range(0, len(prompts), batch):
        for generation in decoder.generate(prompts[start : start + batch], max_new_tokens, stop_token_ids=stops):
            steps += len(generation.acceptance_lengths)
            outputs += len(generation.output_ids)
            for length in generation.acceptance_lengths:
                histogram[length] += 1
        bar.update(min(batch, len(prompts) - start))
    return {**set_result(len(prompts), outputs, steps), "histogram": histogram}


def set_result(prompts: int, output_tokens: int, verify_steps: int) -> dict:
    """One set's figures; the first token of every answer comes from the prefill, not a verify step."""
    committed = output_tokens - prompts
    return {"prompts": prompts, "output_tokens": output_tokens, "verify_steps": verify_steps,
            "mean_acceptance_length": committed / verify_steps if verify_steps else 0.0}


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
    return set_result(len(prompts), outputs, steps)


@contextmanager
def server_measurer(args, concurrency: int, block_size: int):
    """measure(prompts, bar) on one real SGLang DFLASH server with our worker, up for the whole run."""
    from ..demo import dflash_server_args
    from ..launch import launch_server
    from ..targets import smollm2_hf_dir

    target = smollm2_hf_dir() if args.target == "smollm2" else args.target
    flags = dflash_server_args(args.drafter, block_size) + [
        "--max-running-requests", str(concurrency), "--max-total-tokens", "32768", "--dtype", args.dtype]
    with launch_server(target, flags, timeout=900) as server:
        yield lambda prompts, bar: measure_on_server(server, prompts, args.max_new_tokens, bar)


@contextmanager
def reference_measurer(args, tokenizer, block_size: int):
    dtype = DTYPES[args.dtype]
    target = TargetModel.from_pretrained(args.target, dtype=dtype)
    decoder = ReferenceDecoder(target, DFlashDrafter.from_pretrained(args.drafter, dtype=dtype), block_size)
    stops = stop_ids(tokenizer, target)
    yield lambda prompts, bar: measure(decoder, prompts, args.max_new_tokens, stops, args.batch, bar)


def print_table(results: dict) -> None:
    print("\n| set | prompts | output tokens | verify steps | mean acceptance length |\n|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['prompts']} | {r['output_tokens']} | {r['verify_steps']} | {r['mean_acceptance_length']:.2f} |")
    print(f"| average of sets | | | | {average(results):.2f} |")


def average(results: dict) -> float:
    return sum(r["mean_acceptance_length"] for r in results.values()) / len(results)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drafter", required=True)
    parser.add_argument("--target", default="smollm2")
    parser.add_argument("--datasets", default=",".join(DATASETS))
    parser.add_argument("--datasets-dir", type=Path, default=None)
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--block-size", type=int, default=None)
    parser.add_argument("--batch", type=int, default=8, help="prompts decoded together (reference decoder)")
    parser.add_argument("--dtype", choices=DTYPES, default="float32")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here (after every set)")
    parser.add_argument("--server", action="store_true",
                        help="decode on a real SGLang DFLASH server with our worker (each set's prompts concurrently)")
    args = parser.parse_args(argv)

    tokenizer = load_tokenizer(args.target)
    names = [n.strip() for n in args.datasets.split(",") if n.strip()]
    sets = {n: [encode(tokenizer, p, chat=True) for p in first_turns(dataset_file(args.datasets_dir, n), args.num_prompts)]
            for n in names}
    block_size = args.block_size or DFlashConfig.from_pretrained(args.drafter).block_size
    if args.server:
        measurer = server_measurer(args, max(map(len, sets.values())), block_size)
    else:
        measurer = reference_measurer(args, tokenizer, block_size)
    report = {"drafter": str(args.drafter), "target": str(args.target), "num_prompts": args.num_prompts,
              "max_new_tokens": args.max_new_tokens, "dtype": args.dtype, "block_size": block_size,
              "decoder": "sglang server" if args.server else "reference", "sets": {}}
    results = report["sets"]
    with measurer as measure_set, tqdm(total=sum(map(len, sets.values())), desc="acceptance", unit="prompt") as bar:
        for name, prompts in sets.items():
            bar.set_postfix(set=name)
            results[name] = measure_set(prompts, bar)
            bar.write(f"{name}: {results[name]['mean_acceptance_length']:.2f} "
                      f"({results[name]['output_tokens']} tokens, {results[name]['verify_steps']} verify steps)")
            if args.out:
                report["average"] = average(results)
                args.out.write_text(json.dumps(report, indent=2) + "\n")
    print_table(results)
    return 0


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    sys.exit(main())
