"""python -m sglang_dflash.train: prepare data, fit a drafter, or both (every stage resumes after a kill).

  prepare  generate the target's answers to our prompts and cache its features (data/ under --run-dir);
           --responses-from DIR first takes the answer shards archived there instead of generating them
  archive  gzip the run's answer shards into --to DIR (about 20 KB per 64 answers), for --responses-from
  fit      train the drafter on the cached features (checkpoints/ and drafter/ under --run-dir)
  all      prepare, then fit
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sglang_dflash.train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stage", choices=["prepare", "fit", "all", "archive"])
    parser.add_argument("--target", default="smollm2", help="target directory, .gguf file or `smollm2`")
    parser.add_argument("--run-dir", type=Path, default=Path("runs/smollm2-drafter"))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="where the target (prepare) and the drafter (fit) run; default: a GPU if there is one")
    data = parser.add_argument_group("prepare")
    data.add_argument("--num-prompts", type=int, default=2400)
    data.add_argument("--shard-size", type=int, default=48, help="prompts per generation batch and shard")
    data.add_argument("--max-new-tokens", type=int, default=320)
    data.add_argument("--prompt-mix", choices=["v1", "v2"], default="v2",
                      help="the prompt styles of new answers (train/prompts.py); the archived shards 0-15 are v1")
    data.add_argument("--data-dtype", choices=DTYPES, default=None,
                      help="target dtype for data and features (default: bfloat16 where the device runs it natively, "
                           "else float32)")
    data.add_argument("--data-time-budget", type=float, default=None, help="stop preparing after this many seconds")
    data.add_argument("--seed", type=int, default=0)
    data.add_argument("--responses-from", type=Path, default=None,
                      help="a directory of archived answer shards to use before generating any")
    data.add_argument("--corpus-sequences", type=int, default=0,
                      help="also cache this many teacher-forced chunks of the Python standard library and "
                           "language reference on this machine (no generation: one forward each)")
    data.add_argument("--soft-labels", type=int, default=0, metavar="K",
                      help="also cache the target's K most likely next tokens and their log-probabilities at every "
                           "token, for fit's distillation term (default 0: none); added to shards that lack them")
    data.add_argument("--no-answers", action="store_true",
                      help="generate no new answers (use archived and existing ones, and the corpus)")
    parser.add_argument("--to", type=Path, default=None, help="archive: where the gzipped answer shards go")
    fit = parser.add_argument_group("fit")
    fit.add_argument("--steps", type=int, default=2000)
    fit.add_argument("--sequences-per-step", type=int, default=8)
    fit.add_argument("--anchors", type=int, default=16, help="anchor blocks per sequence and step")
    fit.add_argument("--gamma", type=float, default=7.0, help="loss weight of block position k is exp(-(k-1)/gamma)")
    fit.add_argument("--lr", type=float, default=6e-4)
    fit.add_argument("--soft-label-weight", type=float, default=0.0,
                     help="share of each position's loss that is the cross-entropy to the target's top-K distribution "
                          "(cached by prepare --soft-labels K), the rest being the cross-entropy to its token "
                          "(default 0: hard labels only; 0.5 was tried, see the README)")
    fit.add_argument("--decode-anchor-share", type=float, default=0.0,
                     help="share of each sequence's anchors placed where a greedy decode of the current drafter would "
                          "start a block (after its first miss from another random anchor) instead of at random")
    fit.add_argument("--eval-every", type=int, default=100)
    fit.add_argument("--replay-answers", type=int, default=32,
                     help="held-out answers whose greedy decode is replayed at each evaluation; the replayed "
                          "acceptance picks the exported drafter (0: the random-anchor estimate does)")
    fit.add_argument("--fit-time-budget", type=float, default=None, help="stop fitting after this many seconds")
    fit.add_argument("--bf16-autocast", action=argparse.BooleanOptionalAction, default=None,
                     help="train under bf16 autocast (default: where the device runs bf16 natively)")
    fit.add_argument("--init-from-target", action=argparse.BooleanOptionalAction, default=True,
                     help="start the draft layers from the target's top layers")
    fit.add_argument("--init-from", type=Path, default=None,
                     help="start from this exported drafter instead (same shape), e.g. the shipped one")
    fit.add_argument("--heldout-shards", nargs="+", default=None, metavar="SHARD",
                     help="hold out every answer of these shards (e.g. shard-00008) instead of a random 4%%; "
                          "with --init-from, pick shards the starting drafter never trained on")
    return parser


def run_prepare(args) -> int:
    from ..targets import TargetModel, load_tokenizer
    from .corpus import corpus_rows
    from .data import answered_prompts, import_responses, prepare, prepare_corpus
    from .prompts import training_prompts
    from .recipe import drafter_config_for, training_dtype

    # Before the target loads: a wrong archive path fails at once.
    if args.responses_from is not None:
        imported = import_responses(args.responses_from, args.run_dir / "data")
        print(f"{len(imported)} answer shards taken from {args.responses_from}")
    dtype = DTYPES[args.data_dtype] if args.data_dtype else training_dtype(args.device)
    print(f"target in {str(dtype).removeprefix('torch.')} on {args.device}")
    target = TargetModel.from_pretrained(args.target, dtype=dtype, device=args.device)
    config = drafter_config_for(target)
    tokenizer = load_tokenizer(args.target)
    if args.corpus_sequences > 0:
        rows = corpus_rows(tokenizer, args.corpus_sequences, max_tokens=args.max_new_tokens, seed=args.seed)
        shards = prepare_corpus(args.run_dir / "data", target, rows, config.target_layer_ids, args.shard_size,
                                args.soft_labels)
        print(f"{len(rows)} corpus sequences in {shards} shards")
    # Shards already there keep their answers; the new ones get prompts none of them answered.
    prompts = training_prompts(args.num_prompts, seed=args.seed, mix=args.prompt_mix,
                               exclude=answered_prompts(args.run_dir / "data"))
    done = prepare(args.run_dir / "data", target, tokenizer, prompts, config.target_layer_ids,
                   args.shard_size, args.max_new_tokens, args.data_time_budget, generate=not args.no_answers,
                   soft_label_k=args.soft_labels)
    print(f"{done} answer shards ready under {args.run_dir / 'data'}")
    return 0


def run_archive(args) -> int:
    from .data import archive_responses

    if args.to is None:
        raise SystemExit("archive needs --to DIR")
    written = archive_responses(args.run_dir / "data", args.to)
    print(f"{len(written)} answer shards archived under {args.to}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.soft_labels < 0:
        parser.error("--soft-labels must be 0 (none) or a positive number of tokens")
    if not 0.0 <= args.soft_label_weight <= 1.0:
        parser.error("--soft-label-weight must lie between 0 and 1")
    if not 0.0 <= args.decode_anchor_share <= 1.0:
        parser.error("--decode-anchor-share must lie between 0 and 1")
    if args.stage == "archive":
        return run_archive(args)
    torch.manual_seed(args.seed)
    if args.stage in ("prepare", "all"):
        run_prepare(args)
    if args.stage in ("fit", "all"):
        from .fit import run_fit

        run_fit(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
