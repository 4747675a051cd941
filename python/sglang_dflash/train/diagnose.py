"""Where the first draft fails: replayed decode starts binned by the target's own confidence.

Most verify steps of the shipped drafter accept no draft. This asks whether those steps fall where
the target itself hesitates. It replays greedy decoding on cached answers (`replay`), runs the
target (float32) over the same answers for its next-token probabilities, and bins every decode
start by the target's probability of the token the drafter must draft first. Per bin it prints the
steps, how often the first draft is that token, and how often it is the target's runner-up (its
most likely other token) instead; the same bins over every answer position (where training's
random anchors fall) show how decode starts crowd where the target is unsure.

  python -m sglang_dflash.train.diagnose --drafter DIR --run-dir RUN [--shards shard-00015] [--limit N]
"""

from __future__ import annotations

import json
import sys
from bisect import bisect_right

import torch

from .data import FeatureSet

BIN_EDGES = (0.0, 0.3, 0.5, 0.7, 0.9)  # lower edges; the last bin runs to 1


@torch.no_grad()
def label_confidence(target, data: FeatureSet, sequence: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[T] the target's probability of the cached label at each position of `sequence`, and [T] its most
    likely other token there (the runner-up)."""
    start, length = int(data.starts[sequence]), int(data.lengths[sequence])
    ids, labels = data.token_ids[start : start + length], data.labels[start : start + length].long()
    logits, _ = target.forward(ids.to(target.device), torch.arange(length, device=target.device), target.new_cache())
    probs = torch.softmax(logits.cpu(), dim=-1)  # forward's logits are float32
    label_probs = probs.gather(1, labels[:, None])[:, 0]
    others = probs.scatter(1, labels[:, None], -1.0)
    return label_probs, others.argmax(-1)


def confidence_bins(data: FeatureSet, replayed: dict, confidence: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> list[dict]:
    """Per bin of the target's label probability: answer positions, decode starts, first drafts equal to
    the label and first drafts equal to the runner-up."""
    rows = [{"low": low, "high": high, "positions": 0, "decode_starts": 0, "first_draft_right": 0,
             "first_draft_runner_up": 0} for low, high in zip(BIN_EDGES, BIN_EDGES[1:] + (1.0,))]

    def row_of(probability: float) -> dict:
        return rows[bisect_right(BIN_EDGES, probability) - 1]  # probabilities lie in [0, 1]

    for sequence, lengths in replayed["acceptance_lengths"].items():
        label_probs, runner_up = confidence[sequence]
        start, prompt_len, end = int(data.starts[sequence]), int(data.prompt_lens[sequence]), int(data.lengths[sequence]) - 1
        for position in range(prompt_len, end):  # every anchor a block could start from
            row_of(float(label_probs[position]))["positions"] += 1
        anchor = prompt_len
        for length, draft in zip(lengths, replayed["first_drafts"][sequence]):
            row = row_of(float(label_probs[anchor]))
            row["decode_starts"] += 1
            row["first_draft_right"] += int(draft == int(data.labels[start + anchor]))
            row["first_draft_runner_up"] += int(draft == int(runner_up[anchor]))
            anchor += length
    return rows


def format_table(rows: list[dict]) -> str:
    positions, starts = sum(r["positions"] for r in rows), sum(r["decode_starts"] for r in rows)

    def share(part: int, whole: int) -> str:
        return f"{100 * part / whole:.0f}%" if whole else "-"

    lines = ["| target's probability of the first token to draft | answer positions | decode starts "
             "| first draft right | first draft = target's runner-up |", "|---|---:|---:|---:|---:|"]
    for r in reversed(rows):
        lines.append(f"| {r['low']:.1f}-{r['high']:.1f} | {share(r['positions'], positions)} "
                     f"| {share(r['decode_starts'], starts)} ({r['decode_starts']}) "
                     f"| {share(r['first_draft_right'], r['decode_starts'])} "
                     f"| {share(r['first_draft_runner_up'], r['decode_starts'])} |")
    right, runner_up = sum(r["first_draft_right"] for r in rows), sum(r["first_draft_runner_up"] for r in rows)
    lines.append(f"| all | {positions} | {starts} | {share(right, starts)} | {share(runner_up, starts)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from .replay import replay_parser, replay_from_arguments

    args = replay_parser(__doc__, "write the bins as JSON here").parse_args(argv)

    data, sequences, target, replayed = replay_from_arguments(args)
    confidence = {s: label_confidence(target, data, s) for s in sequences}
    rows = confidence_bins(data, replayed, confidence)
    print(f"{replayed['answers']} answers, {replayed['verify_steps']} verify steps: "
          f"mean acceptance length {replayed['mean_acceptance_length']:.3f}")
    print(format_table(rows))
    if args.out:
        args.out.write_text(json.dumps({"drafter": str(args.drafter), "run_dir": str(args.run_dir),
                                        "shards": args.shards, "bins": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
