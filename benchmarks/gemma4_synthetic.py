"""gemma-4-26B-A4B-it + its DFlash drafter at a fixed acceptance: our worker vs SGLang's builtin.

No download: random weights of the real shapes (`--size full`, built on the GPU with transformers'
Gemma-4 classes, saved as bf16 safetensors) or of the scaled-down test pair (`--size tiny`, CPU),
with a word-level tokenizer made here that covers the whole vocabulary. Each implementation gets
one SGLang server with the seed's flags (`--speculative-algorithm DFLASH
--speculative-draft-model-path D --speculative-num-draft-tokens 16`) and SGLANG_SIMULATE_ACC_LEN
(so speed does not depend on what a random drafter guesses); at every concurrency one wave of
that many requests (random prompt ids, greedy, ignore_eos) is timed. Ours also writes per-step
phase times (SGLANG_DFLASH_STEP_TIMES): draft, verify, accept+commit, and the scheduler's
overhead between steps; for the builtin only the step time (wall / verify steps) is known.

    python benchmarks/gemma4_synthetic.py --size tiny --out /tmp/g4-synthetic
Writes OUT/results.json and prints a Markdown table. See benchmarks/gemma4_synthetic.sh.
"""

from __future__ import annotations

import argparse
import concurrent.futures as futures
import json
import statistics
import time
from pathlib import Path

import torch

from sglang_dflash.config import FULL_ATTENTION, SLIDING_ATTENTION, default_target_layer_ids
from sglang_dflash.launch import launch_server
from sglang_dflash.random_checkpoints import GEMMA4_FLAGSHIP_TARGET, make_random_drafter, tiny_target_config

BLOCK = 16
MASK_TOKEN_ID = 4  # the published drafter's
IMPLEMENTATIONS = ("ours", "builtin")

# google/gemma-4-26B-A4B-it's text model (reference notes, section 3.4).
FULL_TARGET = dict(
    vocab_size=262144, hidden_size=2816, num_hidden_layers=30, num_attention_heads=16,
    num_key_value_heads=8, head_dim=256, global_head_dim=512, num_global_key_value_heads=2,
    attention_k_eq_v=True, sliding_window=1024, intermediate_size=2112, enable_moe_block=True,
    num_experts=128, top_k_experts=8, moe_intermediate_size=704, hidden_activation="gelu_pytorch_tanh",
    final_logit_softcapping=30.0, rms_norm_eps=1e-6, tie_word_embeddings=True, hidden_size_per_layer_input=0,
    max_position_embeddings=262144, pad_token_id=0, eos_token_id=1, bos_token_id=2,
)  # fmt: skip
# z-lab/gemma-4-26B-A4B-it-DFlash (section 3.3).
FULL_DRAFTER = dict(
    num_layers=5, num_heads=32, num_kv_heads=8, head_dim=128, intermediate_size=5632, sliding_window=2048,
    layer_types=[SLIDING_ATTENTION] * 4 + [FULL_ATTENTION],
)
TINY_DRAFTER = dict(
    num_layers=5, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128, sliding_window=32,
    layer_types=[SLIDING_ATTENTION] * 4 + [FULL_ATTENTION],
)


def word_level_tokenizer(vocab_size: int):
    """A tokenizer whose ids are all named (`<pad>`, `<eos>`, `<bos>`, ..., `t123`): decodes any output."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = {0: "<pad>", 1: "<eos>", 2: "<bos>", 3: "<unk>", MASK_TOKEN_ID: "<mask>"}
    vocab = {specials.get(i, f"t{i}"): i for i in range(vocab_size)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>", unk_token="<unk>",
        mask_token="<mask>",
    )  # fmt: skip


def build(size: str, out: Path, device: str) -> tuple[Path, Path]:
    """(target, drafter) directories with random weights (reused when already there)."""
    from transformers import AutoModelForCausalLM, Gemma4TextConfig

    target_dir, drafter_dir = out / f"{size}-target", out / f"{size}-drafter"
    if (target_dir / "config.json").exists() and (drafter_dir / "config.json").exists():
        return target_dir, drafter_dir
    if size == "full":
        config, dtype, drafter_shape = Gemma4TextConfig(**FULL_TARGET), torch.bfloat16, FULL_DRAFTER
    else:
        config = tiny_target_config("gemma4", vocab_size=512, **GEMMA4_FLAGSHIP_TARGET)
        dtype, drafter_shape = torch.float32, TINY_DRAFTER
    torch.manual_seed(0)
    with torch.device(device):  # built where it runs: 26 B parameters take minutes on a CPU
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.save_pretrained(target_dir)
    word_level_tokenizer(config.vocab_size).save_pretrained(target_dir)
    del model
    make_random_drafter(
        drafter_dir, hidden_size=config.hidden_size, num_target_layers=config.num_hidden_layers,
        vocab_size=config.vocab_size, block_size=BLOCK, mask_token_id=MASK_TOKEN_ID,
        target_layer_ids=default_target_layer_ids(config.num_hidden_layers, 6), final_logit_softcapping=30.0,
        rope_theta=1e6, dtype=dtype, **drafter_shape,
    )  # fmt: skip
    return target_dir, drafter_dir


def read_step_times(path: Path, began: float, ended: float) -> dict:
    """Mean phase times of our worker's steps that started inside [began, ended] (same monotonic clock)."""
    if not path.exists():
        return {}
    steps = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    steps = [s for s in steps if began <= s["start"] <= ended]
    if not steps:
        return {}
    gaps = [b["start"] - a["end"] for a, b in zip(steps, steps[1:])]
    return {
        "steps": len(steps),
        "draft_ms": 1e3 * statistics.mean(s["draft_s"] for s in steps),
        "verify_ms": 1e3 * statistics.mean(s["verify_s"] for s in steps),
        "accept_commit_ms": 1e3 * statistics.mean(s["accept_commit_s"] for s in steps),
        "overhead_ms": 1e3 * statistics.mean(gaps) if gaps else 0.0,
        "step_ms": 1e3 * statistics.mean(s["end"] - s["start"] for s in steps),
        "mean_batch": statistics.mean(s["batch_size"] for s in steps),
    }


def run_wave(server, prompts: list[list[int]], max_new_tokens: int) -> tuple[float, list[dict]]:
    def one(ids):
        sampling = {"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True}
        return server.post("/generate", {"input_ids": ids, "sampling_params": sampling}, timeout=1800)["meta_info"]

    began = time.perf_counter()
    with futures.ThreadPoolExecutor(len(prompts)) as pool:
        metas = list(pool.map(one, prompts))
    return time.perf_counter() - began, metas


def bench(impl, target, drafter, args, vocab_size: int) -> list[dict]:
    step_file = args.out / f"steps-{impl}.jsonl"
    step_file.unlink(missing_ok=True)
    env = {"SGLANG_DFLASH_IMPL": impl, "SGLANG_SIMULATE_ACC_LEN": str(args.acc_len)}
    if impl == "ours":
        env["SGLANG_DFLASH_STEP_TIMES"] = str(step_file)
    flags = [
        "--speculative-algorithm", "DFLASH",
        "--speculative-draft-model-path", str(drafter),
        "--speculative-num-draft-tokens", str(BLOCK),
        "--max-running-requests", str(max(args.concurrency)),
    ]  # fmt: skip
    generator = torch.Generator().manual_seed(0)
    rows = []
    with launch_server(target, flags, env=env, gpu=args.gpu, timeout=args.startup_timeout, log_dir=args.out / impl) as server:
        run_wave(server, [[5] * 8], 4)  # warm-up
        for concurrency in args.concurrency:
            prompts = torch.randint(5, vocab_size, (concurrency, args.prompt_len), generator=generator).tolist()
            began = time.perf_counter()
            wall, metas = run_wave(server, prompts, args.max_new_tokens)
            tokens = sum(m["completion_tokens"] for m in metas)
            verify_steps = max(m.get("spec_verify_ct", 0) for m in metas)
            row = {
                "impl": impl, "concurrency": concurrency, "tokens": tokens, "wall_s": wall,
                "tokens_per_s": tokens / wall, "accept_length": statistics.mean(m.get("spec_accept_length", 0.0) for m in metas),
                "step_ms_estimate": 1e3 * wall / verify_steps if verify_steps else None,
            }  # fmt: skip
            if impl == "ours":
                row.update(read_step_times(step_file, began, began + wall))
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def table(rows: list[dict]) -> str:
    def cell(row, key):
        value = row.get(key)
        return "-" if value is None else f"{value:.2f}"

    lines = [
        "| impl | conc | tok/s | accept | step ms | draft ms | verify ms | accept+commit ms | overhead ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['impl']} | - | failed: {r['error'][:80]} | | | | | | |")
            continue
        step = r.get("step_ms", r.get("step_ms_estimate"))
        lines.append(
            f"| {r['impl']} | {r['concurrency']} | {r['tokens_per_s']:.1f} | {r['accept_length']:.2f} | "
            f"{'-' if step is None else f'{step:.2f}'} | {cell(r, 'draft_ms')} | {cell(r, 'verify_ms')} | "
            f"{cell(r, 'accept_commit_ms')} | {cell(r, 'overhead_ms')} |"
        )
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=("full", "tiny"), default="tiny")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--gpu", action="store_true", help="build on cuda and serve with SGLang's GPU defaults")
    parser.add_argument("--impls", nargs="+", choices=IMPLEMENTATIONS, default=list(IMPLEMENTATIONS))
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 8, 32])
    parser.add_argument("--acc-len", type=float, default=4.0, help="SGLANG_SIMULATE_ACC_LEN")
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--startup-timeout", type=float, default=900)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    target, drafter = build(args.size, args.out, "cuda" if args.gpu else "cpu")
    vocab_size = json.loads((target / "config.json").read_text())["vocab_size"]
    rows = []
    for impl in args.impls:
        try:
            rows += bench(impl, target, drafter, args, vocab_size)
        except Exception as error:  # one failing server is reported, the other still runs
            rows.append({"impl": impl, "error": f"{type(error).__name__}: {error}"})
            print(f"{impl} failed: {error}", flush=True)
    (args.out / "results.json").write_text(json.dumps({"size": args.size, "acc_len": args.acc_len, "rows": rows}, indent=2))
    print(table(rows))


if __name__ == "__main__":
    main()
