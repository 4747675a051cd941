"""Block-diffusion training of a DFlash drafter on cached target features.

One training example is an anchor position p of a target answer. The drafter sees the target
features of tokens 0..p-1 as its context and the block [token p, MASK x (B-1)] at positions
p..p+B-1, exactly as at decode time, and learns to predict the target's own tokens at p+1..p+B-1.
Many anchors of one sequence are packed into one forward: every block attends to the context
before its own anchor and to itself, never to another block. Position k of a block is weighted
exp(-(k-1)/gamma): early positions decide the acceptance length most. The target's embedding
and LM head are frozen and shared, as at inference.

Where `prepare` cached soft labels (the target's top-k next tokens with their log-probabilities),
the loss can also distil: a `soft_label_weight` share of it is then the cross-entropy from the
target's distribution, renormalised over its top k, to the drafter's, so that a near-tie of the
target teaches both tokens. Off by default: at weight 0.5 it lowered the held-out loss a little and
left the replayed acceptance where it was (README).

Two held-out acceptance figures: at random anchors, 1 + the number of leading drafts equal to
the target's tokens (cheap, smooth, but blind to where a real decode's blocks start), and the
greedy decode of held-out answers replayed block by block (`replay`: what a server would report
on those answers), which picks the exported drafter.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from ..drafter import DFlashDrafter
from .data import FeatureSet

CHECKPOINT = "last.pt"


@dataclass
class FitConfig:
    steps: int = 2000
    sequences_per_step: int = 8
    anchors_per_sequence: int = 16
    gamma: float = 7.0
    lr: float = 6e-4
    warmup_steps: int = 60
    weight_decay: float = 0.01
    max_context: int = 768
    eval_every: int = 100
    save_every: int = 25
    heldout_fraction: float = 0.04
    heldout_shards: tuple[str, ...] | None = None
    eval_anchors: int = 384
    replay_answers: int = 32  # held-out answers whose greedy decode is replayed at each evaluation (0: none)
    time_budget_s: float | None = None
    autocast_bf16: bool = True
    soft_label_weight: float = 0.0  # used only where the data has soft labels
    decode_anchor_share: float = 0.0  # share of each sequence's anchors placed where a greedy decode starts a block
    seed: int = 0
    device: str = "cpu"


@dataclass
class PackedBatch:
    features: torch.Tensor  # [S, T, F] target features of the context tokens
    context_valid: torch.Tensor  # [S, T]
    block_ids: torch.Tensor  # [S, A*B]
    block_positions: torch.Tensor  # [S, A*B]
    anchor_positions: torch.Tensor  # [S, A]
    labels: torch.Tensor  # [S, A, B-1] the target's tokens at p+1..p+B-1
    label_valid: torch.Tensor  # [S, A, B-1]
    soft_ids: torch.Tensor | None = None  # [S, A, B-1, k] the target's top-k tokens at each label
    soft_logprobs: torch.Tensor | None = None  # [S, A, B-1, k] their log-probabilities

    def to(self, device) -> "PackedBatch":
        return PackedBatch(**{name: None if tensor is None else tensor.to(device) for name, tensor in vars(self).items()})


def pack(data: FeatureSet, sequences: list[int], anchors: list[list[int]], block_size: int, mask_id: int) -> PackedBatch:
    """Context features, blocks and labels for `anchors[i]` of sequence `sequences[i]` (all lists equally long)."""
    features, context_valid = pack_context(data, sequences)
    return pack_blocks(data, sequences, anchors, block_size, mask_id, features, context_valid)


def pack_context(data: FeatureSet, sequences: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """[S, T, F] target features of each sequence's tokens (zero-padded) and [S, T] their validity."""
    longest = max(int(data.lengths[s]) for s in sequences)
    features = torch.zeros(len(sequences), longest, data.features.shape[1], dtype=data.features.dtype)
    context_valid = torch.zeros(len(sequences), longest, dtype=torch.bool)
    for row, sequence in enumerate(sequences):
        start, length = int(data.starts[sequence]), int(data.lengths[sequence])
        features[row, :length] = data.features[start : start + length]
        context_valid[row, :length] = True
    return features, context_valid


def pack_blocks(data: FeatureSet, sequences: list[int], anchors: list[list[int]], block_size: int, mask_id: int,
                features: torch.Tensor, context_valid: torch.Tensor) -> PackedBatch:
    """The blocks and labels of `anchors` over context already packed by `pack_context`."""
    num_anchors = len(anchors[0])
    offsets = torch.arange(block_size)
    anchor_positions = torch.tensor(anchors)
    block_positions = (anchor_positions[:, :, None] + offsets).reshape(len(sequences), -1)
    block_ids = torch.full(block_positions.shape, mask_id, dtype=torch.long)
    labels = torch.zeros(len(sequences), num_anchors, block_size - 1, dtype=torch.long)
    label_valid = torch.zeros_like(labels, dtype=torch.bool)
    soft_k = data.soft_label_k
    if soft_k:
        soft_ids = torch.zeros(*labels.shape, soft_k, dtype=torch.long)
        soft_logprobs = torch.zeros(*labels.shape, soft_k, dtype=torch.float32)
    for row, sequence in enumerate(sequences):
        start, length = int(data.starts[sequence]), int(data.lengths[sequence])
        tokens, targets = data.token_ids[start : start + length], data.labels[start : start + length]
        for a, p in enumerate(anchors[row]):
            block_ids[row, a * block_size] = tokens[p]
            # labels[i] is the target's token after token i, so position p+k is predicted by labels[p+k-1].
            count = greedy_path_length(tokens, targets, p, min(p + block_size - 1, length - 1) - p)
            labels[row, a, :count] = targets[p : p + count]
            label_valid[row, a, :count] = True
            if soft_k:
                soft_ids[row, a, :count] = data.soft_ids[start + p : start + p + count].long()
                soft_logprobs[row, a, :count] = data.soft_logprobs[start + p : start + p + count].float()
    soft = (soft_ids, soft_logprobs) if soft_k else (None, None)
    return PackedBatch(features, context_valid, block_ids, block_positions, anchor_positions, labels, label_valid, *soft)


def greedy_path_length(tokens: torch.Tensor, targets: torch.Tensor, anchor: int, count: int) -> int:
    """How many of the `count` labels after `anchor` lie on the target's own greedy path.

    Label k is the target's choice after tokens[..anchor+k]; it is what greedy decoding would
    produce only while the text itself follows the target (tokens[anchor+j+1] == targets[anchor+j]
    for j < k). On the target's own answers that holds everywhere; on other text (a corpus, or
    answers generated in another precision) the labels stop at the first departure.
    """
    if count <= 0:
        return 0
    agrees = tokens[anchor + 1 : anchor + count] == targets[anchor : anchor + count - 1]
    return 1 + int(agrees.long().cumprod(0).sum())


def packed_visibility(batch: PackedBatch, block_size: int, window: int | None, causal: bool) -> torch.Tensor:
    """[S, A*B, T + A*B]: a block query sees context tokens before its anchor and its own block only."""
    num_seq, num_queries = batch.block_positions.shape
    query_anchor = batch.anchor_positions.repeat_interleave(block_size, dim=1)  # [S, Q]
    device = batch.features.device
    context_positions = torch.arange(batch.features.shape[1], device=device)
    sees_context = (context_positions[None, None, :] < query_anchor[:, :, None]) & batch.context_valid[:, None, :]
    query_index = torch.arange(num_queries, device=device)
    block_of_query = query_index // block_size
    sees_block = (block_of_query[:, None] == block_of_query[None, :]).expand(num_seq, -1, -1)
    if causal:
        sees_block = sees_block & (query_index[None, :] <= query_index[:, None])
    if window is not None:
        query_positions = batch.block_positions
        sees_context = sees_context & ((query_positions[:, :, None] - context_positions[None, None, :]) < window)
    return torch.cat([sees_context, sees_block], dim=-1)


def context_keys_values(drafter: DFlashDrafter, batch: PackedBatch) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every draft layer's keys and values of the packed context (they do not depend on the blocks)."""
    num_seq, length = batch.features.shape[:2]
    context = drafter.hidden_norm(drafter.fc(batch.features.to(drafter.fc.weight.dtype)))
    cos, sin = drafter.rotary(torch.arange(length, device=batch.features.device).expand(num_seq, -1))
    return [layer.self_attn.keys_values(context, cos, sin) for layer in drafter.layers]


def block_hidden(drafter: DFlashDrafter, embed_weight: torch.Tensor, batch: PackedBatch,
                 context_kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> torch.Tensor:
    """The drafter's final hidden states for every packed block query: [S, A*B, H].

    `context_kv` (from `context_keys_values` on the same context) saves recomputing the context.
    """
    config = drafter.config
    context_kv = context_kv if context_kv is not None else context_keys_values(drafter, batch)
    cos, sin = drafter.rotary(batch.block_positions)
    hidden = F.embedding(batch.block_ids, embed_weight).to(drafter.fc.weight.dtype)
    masks = {}
    for index, (layer, (keys, values)) in enumerate(zip(drafter.layers, context_kv)):
        key = (config.window_for_layer(index), config.causal_for_layer(index))
        if key not in masks:
            masks[key] = packed_visibility(batch, config.block_size, *key)
        hidden = layer.forward_masked(hidden, cos, sin, keys, values, masks[key])
    return drafter.norm(hidden)


def position_weights(block_size: int, gamma: float) -> torch.Tensor:
    """exp(-(k-1)/gamma) for block positions k = 1..B-1."""
    return torch.exp(-torch.arange(block_size - 1, dtype=torch.float32) / gamma)


def draft_logits(drafter: DFlashDrafter, embed_weight: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
    """[S, A, B-1, V] logits at block positions 1..B-1 through the shared (frozen) LM head."""
    block = drafter.config.block_size
    hidden = block_hidden(drafter, embed_weight, batch)
    hidden = hidden.view(hidden.shape[0], -1, block, hidden.shape[-1])[:, :, 1:]
    return drafter.logits(hidden, lambda h: F.linear(h.to(embed_weight.dtype), embed_weight))


def weighted_loss(logits: torch.Tensor, batch: PackedBatch, weights: torch.Tensor, soft_label_weight: float = 0.0) -> torch.Tensor:
    """Position-weighted cross-entropy to the target's tokens; with `soft_label_weight` > 0 (and soft
    labels in the batch) that share of each position's loss is the cross-entropy to the target's
    top-k distribution instead."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    losses = -logprobs.gather(-1, batch.labels[..., None]).squeeze(-1)
    if soft_label_weight > 0 and batch.soft_ids is not None:
        teacher = torch.softmax(batch.soft_logprobs, dim=-1)
        soft = -(teacher * logprobs.gather(-1, batch.soft_ids)).sum(-1)
        losses = (1 - soft_label_weight) * losses + soft_label_weight * soft
    w = weights[None, None, :] * batch.label_valid
    return (losses * w).sum() / w.sum().clamp_min(1e-6)


def acceptance_lengths(logits: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
    """[S, A]: 1 + leading drafts equal to the target's tokens (the greedy accept rule, bonus included)."""
    correct = (logits.argmax(-1) == batch.labels) & batch.label_valid
    return 1 + correct.long().cumprod(dim=-1).sum(dim=-1)


def split_sequences(data: FeatureSet, heldout_fraction: float, seed: int,
                    heldout_shards: tuple[str, ...] | None = None) -> tuple[list[int], list[int]]:
    """(training, held-out) sequence ids. Held-out answers are always generated answers, never corpus
    text: either every answer of `heldout_shards` or a random `heldout_fraction` of all answers."""
    usable = [i for i in range(len(data)) if int(data.lengths[i] - data.prompt_lens[i]) >= 2]
    if heldout_shards:
        unknown = set(heldout_shards) - set(data.sources or ())
        if unknown:
            raise ValueError(f"held-out shards {sorted(unknown)} are not in the data")
        heldout = [i for i in usable if data.sources[i] in heldout_shards]
    else:
        answers = [i for i in usable if data.is_generated_answer(i)]
        random.Random(seed).shuffle(answers)
        heldout = answers[: max(1, int(len(answers) * heldout_fraction))]
    chosen = set(heldout)
    return [i for i in usable if i not in chosen], sorted(heldout)


def last_anchor(data: FeatureSet, sequence: int) -> int:
    """The last position a block may start from: its anchor needs at least one label after it."""
    return int(data.lengths[sequence]) - 2


def sample_anchors(data: FeatureSet, sequence: int, count: int, rng: random.Random) -> list[int]:
    """Anchor positions among the answer tokens (the first block's anchor is the first answer token)."""
    candidates = range(int(data.prompt_lens[sequence]), last_anchor(data, sequence) + 1)
    return rng.sample(candidates, count) if len(candidates) >= count else [rng.choice(candidates) for _ in range(count)]


def next_block_anchors(data: FeatureSet, sequences: list[int], logits: torch.Tensor, batch: PackedBatch) -> list[list[int]]:
    """Where greedy decoding would start its next block after each block of `batch`: anchor + acceptance length.

    That anchor is the target's own token right after the drafter's first miss, the kind of position
    every real decode block starts from (and a random anchor seldom is); clipped to the last anchor
    a sequence allows.
    """
    starts = batch.anchor_positions.to(logits.device) + acceptance_lengths(logits.float(), batch)
    return [[min(int(p), last_anchor(data, s)) for p in row] for s, row in zip(sequences, starts.tolist())]


def fits_context(data: FeatureSet, sequence: int, max_context: int) -> bool:
    return int(data.lengths[sequence]) <= max_context


class Trainer:
    def __init__(self, drafter: DFlashDrafter, embed_weight: torch.Tensor, data: FeatureSet, run_dir: Path, cfg: FitConfig):
        self.device = torch.device(cfg.device)
        self.drafter, self.embed_weight = drafter.to(self.device), embed_weight.to(self.device)
        self.data, self.cfg = data, cfg
        self.run_dir = Path(run_dir)
        (self.run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        self.train_ids, self.heldout_ids = split_sequences(data, cfg.heldout_fraction, cfg.seed, cfg.heldout_shards)
        self.train_ids = [i for i in self.train_ids if fits_context(data, i, cfg.max_context)]
        self.weights = position_weights(drafter.config.block_size, cfg.gamma).to(self.device)
        decay = [p for n, p in drafter.named_parameters() if p.ndim >= 2]
        no_decay = [p for n, p in drafter.named_parameters() if p.ndim < 2]
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=cfg.lr, betas=(0.9, 0.95),
        )
        self.step, self.best_acceptance, self.history = 0, 0.0, []
        self.rng = random.Random(cfg.seed)
        self.eval_batches = self._heldout_batches()

    # ------------------------------------------------------------------ schedule and checkpoints
    def lr_at(self, step: int) -> float:
        if step < self.cfg.warmup_steps:
            return self.cfg.lr * (step + 1) / self.cfg.warmup_steps
        progress = (step - self.cfg.warmup_steps) / max(1, self.cfg.steps - self.cfg.warmup_steps)
        return self.cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))

    def save(self) -> None:
        state = {
            "drafter": self.drafter.state_dict(), "optimizer": self.optimizer.state_dict(), "step": self.step,
            "best_acceptance": self.best_acceptance, "history": self.history, "rng": self.rng.getstate(),
            "torch_rng": torch.get_rng_state(),
        }
        path = self.run_dir / "checkpoints" / CHECKPOINT
        partial = path.with_name(path.name + ".partial")
        torch.save(state, partial)
        partial.replace(path)

    def resume(self) -> bool:
        path = self.run_dir / "checkpoints" / CHECKPOINT
        if not path.exists():
            return False
        state = torch.load(path, weights_only=False, map_location="cpu")
        self.drafter.load_state_dict(state["drafter"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step, self.best_acceptance, self.history = state["step"], state["best_acceptance"], state["history"]
        self.rng.setstate(state["rng"])
        torch.set_rng_state(state["torch_rng"])
        return True

    def export(self, name: str = "drafter") -> Path:
        out = self.run_dir / name
        self.drafter.save_pretrained(out, dtype=torch.bfloat16)
        return out

    # ------------------------------------------------------------------ steps
    def _batch(self, sequences: list[int], anchors_per_sequence: int, rng: random.Random) -> PackedBatch:
        return self._pack(sequences, [sample_anchors(self.data, s, anchors_per_sequence, rng) for s in sequences])

    def _pack(self, sequences: list[int], anchors: list[list[int]],
              context: tuple[torch.Tensor, torch.Tensor] | None = None) -> PackedBatch:
        """`anchors` of `sequences` packed; `context` (from `pack_context` on the same sequences) saves packing it again."""
        config = self.drafter.config
        context = context if context is not None else pack_context(self.data, sequences)
        return pack_blocks(self.data, sequences, anchors, config.block_size, config.mask_token_id, *context).to(self.device)

    def _training_batch(self, sequences: list[int]) -> PackedBatch:
        """Random anchors, and (with `decode_anchor_share`) anchors where a greedy decode would start a block.

        The latter come from a gradient-free forward of the current drafter at other random anchors:
        each such block's next anchor (`next_block_anchors`). Real decode blocks all start after a
        miss, and their acceptance, not the random anchors', is what a server reports.
        """
        total = self.cfg.anchors_per_sequence
        decode = round(total * self.cfg.decode_anchor_share)
        anchors = [sample_anchors(self.data, s, total - decode, self.rng) for s in sequences]
        context = pack_context(self.data, sequences)  # shared by the probes and the training blocks
        if decode:
            probe_anchors = [sample_anchors(self.data, s, decode, self.rng) for s in sequences]
            probes = self._pack(sequences, probe_anchors, context)
            with torch.no_grad(), self._autocast():
                logits = draft_logits(self.drafter, self.embed_weight, probes)
            anchors = [own + found for own, found in zip(anchors, next_block_anchors(self.data, sequences, logits, probes))]
        return self._pack(sequences, anchors, context)

    def _heldout_batches(self) -> list[PackedBatch]:
        rng = random.Random(self.cfg.seed + 1)
        per_sequence = max(1, self.cfg.eval_anchors // max(1, len(self.heldout_ids)))
        size = self.cfg.sequences_per_step
        return [self._batch(self.heldout_ids[i : i + size], per_sequence, rng)
                for i in range(0, len(self.heldout_ids), size)]

    def _autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.cfg.autocast_bf16)

    def train_step(self) -> float:
        self.drafter.train()
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr_at(self.step)
        sequences = self.rng.sample(self.train_ids, self.cfg.sequences_per_step)
        batch = self._training_batch(sequences)
        with self._autocast():
            logits = draft_logits(self.drafter, self.embed_weight, batch)
            loss = weighted_loss(logits, batch, self.weights, self.cfg.soft_label_weight)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.drafter.parameters(), 1.0)
        self.optimizer.step()
        self.step += 1
        return float(loss.detach())

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        self.drafter.eval()
        lengths, losses = [], []
        for batch in self.eval_batches:
            with self._autocast():
                logits = draft_logits(self.drafter, self.embed_weight, batch)
            losses.append(float(weighted_loss(logits, batch, self.weights)))
            lengths.append(acceptance_lengths(logits.float(), batch).flatten())
        accepted = torch.cat(lengths).float()
        metrics = {"heldout_loss": sum(losses) / len(losses), "heldout_acceptance": float(accepted.mean())}
        if self.cfg.replay_answers > 0:
            from .replay import replay_acceptance

            replayed = replay_acceptance(self.drafter, self.embed_weight, self.data,
                                         self.heldout_ids[: self.cfg.replay_answers], autocast=self._autocast)
            metrics["heldout_replay"] = replayed["mean_acceptance_length"]
        return metrics

    @staticmethod
    def score(metrics: dict[str, float]) -> float:
        """What picks the exported drafter: the replayed decode's acceptance where measured (see `replay`)."""
        return metrics.get("heldout_replay", metrics["heldout_acceptance"])

    def fit(self) -> dict[str, float]:
        started = time.monotonic()
        bar = tqdm(total=self.cfg.steps, initial=self.step, desc="fit", unit="step")
        metrics = self.history[-1] if self.history else {}
        running = None
        while self.step < self.cfg.steps:
            if self.cfg.time_budget_s is not None and time.monotonic() - started > self.cfg.time_budget_s:
                bar.write(f"time budget of {self.cfg.time_budget_s:.0f}s spent at step {self.step}; run again to resume")
                break
            loss = self.train_step()
            running = loss if running is None else 0.95 * running + 0.05 * loss
            if self.step % self.cfg.eval_every == 0 or self.step == self.cfg.steps:
                metrics = {"step": self.step, "train_loss": running, **self.evaluate()}
                self.history.append(metrics)
                bar.write(f"step {self.step}: " + ", ".join(f"{k}={v:.4g}" for k, v in metrics.items() if k != "step"))
                if self.score(metrics) > self.best_acceptance:
                    self.best_acceptance = self.score(metrics)
                    self.export()
            if self.step % self.cfg.save_every == 0:
                self.save()
            bar.set_postfix(loss=f"{running:.3f}", acc=f"{self.score(metrics) if metrics else float('nan'):.2f}",
                            lr=f"{self.lr_at(self.step):.1e}")
            bar.update(1)
        bar.close()
        self.save()
        return metrics


def run_fit(args) -> dict[str, float]:
    from ..targets import TargetModel
    from .recipe import drafter_config_for, native_bfloat16

    # The data first: a data directory that cannot serve this fit fails before the target loads.
    distilling = args.soft_label_weight > 0
    data = FeatureSet.load(args.run_dir / "data", soft_labels=distilling)
    if distilling and not data.soft_label_k:
        raise SystemExit(f"--soft-label-weight {args.soft_label_weight:g} needs soft labels, and "
                         f"{args.run_dir / 'data'} has none: run prepare --soft-labels K first")
    target = TargetModel.from_pretrained(args.target, dtype=torch.float32)
    config = drafter_config_for(target)
    torch.manual_seed(args.seed)
    drafter = DFlashDrafter(config)
    if args.init_from is not None:
        initialize_from_drafter(drafter, args.init_from)
    elif args.init_from_target:
        initialize_from_target(drafter, target)
    embed_weight = shared_embedding(target)
    del target
    cfg = FitConfig(steps=args.steps, sequences_per_step=args.sequences_per_step, anchors_per_sequence=args.anchors,
                    replay_answers=args.replay_answers,
                    gamma=args.gamma, lr=args.lr, eval_every=args.eval_every, time_budget_s=args.fit_time_budget,
                    seed=args.seed, device=args.device, heldout_shards=tuple(args.heldout_shards or ()) or None,
                    soft_label_weight=args.soft_label_weight, decode_anchor_share=args.decode_anchor_share,
                    autocast_bf16=native_bfloat16(args.device) if args.bf16_autocast is None else args.bf16_autocast)
    trainer = Trainer(drafter, embed_weight, data, args.run_dir, cfg)
    resumed = trainer.resume()
    start = "from " + str(args.init_from) if args.init_from is not None else "from scratch"
    corpus = sum(not data.is_generated_answer(i) for i in range(len(data)))
    recipe = (f"distilling the target's top-{data.soft_label_k} distribution at weight {cfg.soft_label_weight:g}"
              if distilling else "hard labels only")
    if cfg.decode_anchor_share > 0:
        recipe += f"; {cfg.decode_anchor_share:.0%} of the anchors where a greedy decode starts a block"
    print(f"{len(trainer.train_ids)} training sequences ({corpus} of them corpus text) and "
          f"{len(trainer.heldout_ids)} held-out answers, {data.num_response_tokens} answer tokens; "
          f"bf16 autocast {'on' if cfg.autocast_bf16 else 'off'}; {recipe}; "
          f"{'resumed at step ' + str(trainer.step) if resumed else start}")
    return trainer.fit()


def shared_embedding(target) -> torch.Tensor:
    """The target's embedding matrix, which is also its LM head: the drafter's frozen input and output (bf16)."""
    embedding, head = target.model.get_input_embeddings(), target.model.get_output_embeddings()
    if type(embedding) is not torch.nn.Embedding or embedding.weight.data_ptr() != head.weight.data_ptr():
        raise ValueError("this recipe needs a plain embedding tied to the LM head (as in SmolLM2)")
    return embedding.weight.detach().to(torch.bfloat16)


def initialize_from_target(drafter: DFlashDrafter, target) -> None:
    """Start each draft layer from one of the target's top layers (same shapes), and the final norm likewise.

    The draft layers then begin by doing what the target's last layers do to a residual stream;
    q_norm/k_norm (absent in Llama) start as identity-scaled norms.
    """
    layers = target.layers
    top = len(layers) - len(drafter.layers)
    for draft_layer, target_layer in zip(drafter.layers, list(layers)[top:]):
        source = target_layer.state_dict()
        own = draft_layer.state_dict()
        own.update({name: tensor for name, tensor in source.items() if name in own and own[name].shape == tensor.shape})
        draft_layer.load_state_dict(own)
    drafter.norm.weight.data.copy_(target.model.model.norm.weight.data)


def initialize_from_drafter(drafter: DFlashDrafter, path: Path) -> None:
    """Warm start: every weight from an exported drafter of exactly this shape (e.g. the shipped one)."""
    source = DFlashDrafter.from_pretrained(path, dtype=torch.float32)
    if source.config.to_dict() != drafter.config.to_dict():
        mine, theirs = drafter.config.to_dict(), source.config.to_dict()
        differing = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        raise ValueError(f"drafter {path} has another shape than this recipe's; differing config keys: {differing}")
    drafter.load_state_dict(source.state_dict())
