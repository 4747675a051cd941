"""Greedy decoding replayed on cached target answers: the acceptance length a server would report.

The estimate at random anchors (`fit.acceptance_lengths`) overrates a drafter: in a real decode
every block starts where the previous one failed, right after a token the drafter did not foresee.
A target answer is the target's own greedy output and its cached features are what the target's
verify passes compute, so the decode can be replayed without the target: the first block is
anchored at the first answer token (the prefill's token), each verify commits the accepted drafts
plus the target's own token, and the next block is anchored at that token. The answer's end caps
the last step, as EOS or the token limit does on a server, so the figure is the acceptance tool's
(answer tokens - 1) / verify steps on these answers.

  python -m sglang_dflash.train.replay --drafter DIR --run-dir RUN [--shards shard-00015 ...] [--limit N]
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F

from ..drafter import DFlashDrafter
from .data import FeatureSet
from .fit import block_hidden, context_keys_values, pack_blocks, pack_context


def leading_matches(drafter: DFlashDrafter, embed_weight: torch.Tensor, hidden: torch.Tensor,
                    labels: torch.Tensor, label_valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[S]: 1 + the leading drafts equal to `labels` ([S, K]) from block hiddens `hidden` ([S, K, H]),
    and [S]: each row's first draft.

    The same figure as `fit.acceptance_lengths`, but position k's logits are computed only for the
    rows whose drafts matched up to k: the LM head is most of the cost and most rows stop at k = 1.
    """
    lengths = torch.ones(labels.shape[0], dtype=torch.long, device=labels.device)
    alive = torch.arange(labels.shape[0], device=labels.device)
    first_drafts = None
    for k in range(labels.shape[1]):
        if alive.numel() == 0:
            break
        drafts = drafter.logits(hidden[alive, k], lambda h: F.linear(h.to(embed_weight.dtype), embed_weight)).argmax(-1)
        first_drafts = drafts if first_drafts is None else first_drafts
        alive = alive[(drafts == labels[alive, k]) & label_valid[alive, k]]
        lengths[alive] += 1
    return lengths, first_drafts


@torch.no_grad()
def replay_acceptance(drafter: DFlashDrafter, embed_weight: torch.Tensor, data: FeatureSet, sequences: list[int],
                      batch_size: int = 16, autocast=nullcontext) -> dict:
    """Greedy decoding of the answers `sequences` replayed with `drafter`: mean acceptance length, histogram,
    and every answer's acceptance lengths and first drafts step by step."""
    block, mask_id = drafter.config.block_size, drafter.config.mask_token_id
    device = embed_weight.device
    per_answer = {s: [] for s in sequences}
    first_drafts = {s: [] for s in sequences}
    for first in range(0, len(sequences), batch_size):
        chunk = sequences[first : first + batch_size]
        features, context_valid = (t.to(device) for t in pack_context(data, chunk))
        anchors = [int(data.prompt_lens[s]) for s in chunk]
        ends = [int(data.lengths[s]) - 1 for s in chunk]  # position of each answer's last token
        context_kv = None
        while any(a < e for a, e in zip(anchors, ends)):
            # Finished answers keep a valid anchor so the batch keeps its shape; their results are dropped.
            batch = pack_blocks(data, chunk, [[min(a, e - 1)] for a, e in zip(anchors, ends)], block, mask_id,
                                features, context_valid).to(device)
            with autocast():
                context_kv = context_kv if context_kv is not None else context_keys_values(drafter, batch)
                hidden = block_hidden(drafter, embed_weight, batch, context_kv)[:, 1:]
                lengths, drafts = leading_matches(drafter, embed_weight, hidden, batch.labels[:, 0],
                                                  batch.label_valid[:, 0])
            for row, (length, draft) in enumerate(zip(lengths.tolist(), drafts.tolist())):
                if anchors[row] >= ends[row]:
                    continue
                length = min(length, ends[row] - anchors[row])
                per_answer[chunk[row]].append(length)
                first_drafts[chunk[row]].append(draft)
                anchors[row] += length
    lengths = [length for answer in per_answer.values() for length in answer]
    histogram = [0] * (block + 1)
    for length in lengths:
        histogram[length] += 1
    return {"answers": len(sequences), "verify_steps": len(lengths), "committed_tokens": sum(lengths),
            "mean_acceptance_length": sum(lengths) / len(lengths) if lengths else 0.0, "histogram": histogram,
            "acceptance_lengths": per_answer, "first_drafts": first_drafts}


def answer_sequences(data: FeatureSet, run_dir: Path, shards: list[str] | None, limit: int | None) -> list[int]:
    """The generated answers (at least 2 tokens) of `shards` (None: all), at most `limit`; exits on none."""
    unknown = set(shards or ()) - set(data.sources or ())
    if unknown:
        raise SystemExit(f"shards {sorted(unknown)} are not in {run_dir / 'data'}")
    sequences = [i for i in range(len(data)) if data.is_generated_answer(i)
                 and (shards is None or data.sources[i] in shards)
                 and int(data.lengths[i] - data.prompt_lens[i]) >= 2][:limit]
    if not sequences:
        raise SystemExit("no generated answers to replay")
    return sequences


def replay_parser(description: str, out_help: str) -> argparse.ArgumentParser:
    """The command line of a tool built on a replay (this one, `diagnose`): what to replay, and `--out`."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drafter", required=True, type=Path, help="an exported drafter directory")
    parser.add_argument("--run-dir", required=True, type=Path, help="a training run whose data/ holds answer features")
    parser.add_argument("--shards", nargs="+", default=None, metavar="SHARD",
                        help="replay the answers of these shards (default: every generated answer)")
    parser.add_argument("--limit", type=int, default=None, help="at most this many answers")
    parser.add_argument("--target", default="smollm2")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--out", type=Path, default=None, help=out_help)
    return parser


def replay_from_arguments(args: argparse.Namespace):
    """The replay that `replay_parser`'s arguments describe: (data, sequences, float32 target, result)."""
    from ..targets import TargetModel
    from .fit import shared_embedding

    data = FeatureSet.load(args.run_dir / "data", soft_labels=False)
    sequences = answer_sequences(data, args.run_dir, args.shards, args.limit)
    target = TargetModel.from_pretrained(args.target, dtype=torch.float32)
    drafter = DFlashDrafter.from_pretrained(args.drafter, dtype=torch.float32).eval()
    return data, sequences, target, replay_acceptance(drafter, shared_embedding(target).float(), data, sequences,
                                                      args.batch_size)


def main(argv: list[str] | None = None) -> int:
    args = replay_parser(__doc__, "write the result as JSON here").parse_args(argv)
    _, _, _, result = replay_from_arguments(args)
    print(f"{result['answers']} answers, {result['verify_steps']} verify steps, {result['committed_tokens']} tokens: "
          f"mean acceptance length {result['mean_acceptance_length']:.3f}")
    print("histogram (acceptance length: steps): " + ", ".join(
        f"{length}: {count}" for length, count in enumerate(result["histogram"]) if count))
    if args.out:
        kept = {key: value for key, value in result.items() if key != "first_drafts"}
        args.out.write_text(json.dumps({"drafter": str(args.drafter), "run_dir": str(args.run_dir),
                                        "shards": args.shards, **kept}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
