"""The training recipe: packed blocks compute exactly what decoding computes, labels line up, resume is exact."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from sglang_dflash.config import FULL_ATTENTION, SLIDING_ATTENTION, DFlashConfig
from sglang_dflash.drafter import DFlashDrafter, DraftContext
from sglang_dflash.train.data import FeatureSet, answered_prompts, archive_responses, import_responses, prepare
from sglang_dflash.train.fit import (
    FitConfig,
    Trainer,
    acceptance_lengths,
    draft_logits,
    greedy_path_length,
    initialize_from_drafter,
    last_anchor,
    next_block_anchors,
    pack,
    split_sequences,
    position_weights,
    sample_anchors,
    weighted_loss,
)
from sglang_dflash.train.prompts import gsm8k_train_questions, training_prompts
from sglang_dflash.train.recipe import native_bfloat16, training_dtype

HIDDEN, VOCAB, BLOCK = 32, 97, 8


def tiny_config(layer_types=(FULL_ATTENTION, FULL_ATTENTION), window=None, causal=None) -> DFlashConfig:
    config = DFlashConfig(
        hidden_size=HIDDEN, num_hidden_layers=len(layer_types), num_attention_heads=4, num_key_value_heads=2,
        head_dim=8, intermediate_size=64, rms_norm_eps=1e-6, num_target_layers=4, target_layer_ids=[1, 2],
        block_size=BLOCK, mask_token_id=VOCAB - 1, layer_types=list(layer_types), sliding_window=window,
        is_causal=causal, vocab_size=VOCAB,
    )
    return DFlashConfig.from_dict(config.to_dict())


def random_feature_set(lengths=(30, 23, 41), prompt_lens=(5, 7, 4), seed=0) -> FeatureSet:
    """Random sequences as the target's own answers: each label is the sequence's next token."""
    generator = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    starts = torch.tensor([0, *torch.tensor(lengths).cumsum(0)[:-1].tolist()])
    token_ids = torch.randint(0, VOCAB - 1, (total,), generator=generator)
    labels = torch.roll(token_ids, -1)
    ends = starts + torch.tensor(lengths) - 1
    labels[ends] = torch.randint(0, VOCAB - 1, (len(lengths),), generator=generator)
    return FeatureSet(
        token_ids=token_ids,
        labels=labels,
        features=torch.randn(total, 2 * HIDDEN, generator=generator),
        starts=starts, lengths=torch.tensor(lengths), prompt_lens=torch.tensor(prompt_lens),
    )


@pytest.mark.parametrize(
    "layer_types,window,causal",
    [((FULL_ATTENTION, FULL_ATTENTION), None, None),
     ((SLIDING_ATTENTION, FULL_ATTENTION), BLOCK + 3, None),
     ((FULL_ATTENTION,), None, True)],
)
def test_packed_blocks_equal_decode_time_drafts(layer_types, window, causal):
    """Each packed block's logits equal the inference drafter's on the same context and block."""
    torch.manual_seed(0)
    config = tiny_config(layer_types, window, causal)
    drafter = DFlashDrafter(config).eval()
    embed = torch.randn(VOCAB, HIDDEN)
    data = random_feature_set()
    anchors = [[5, 11, 28], [7, 20, 21], [4, 39, 30]]
    batch = pack(data, [0, 1, 2], anchors, BLOCK, config.mask_token_id)
    with torch.no_grad():
        packed = draft_logits(drafter, embed, batch)  # [S, A, B-1, V]
        for row, sequence in enumerate([0, 1, 2]):
            start = int(data.starts[sequence])
            for a, p in enumerate(anchors[row]):
                context = DraftContext()
                positions = torch.arange(p)
                context.append(drafter.context_keys_values(data.features[start : start + p], positions), positions)
                block = torch.full((1, BLOCK), config.mask_token_id)
                block[0, 0] = data.token_ids[start + p]
                hidden = drafter(embed[block], torch.arange(p, p + BLOCK)[None], [context])
                expected = drafter.logits(hidden[:, 1:], lambda h: h @ embed.T)[0]
                torch.testing.assert_close(packed[row, a], expected, atol=1e-4, rtol=1e-4)


def test_labels_are_the_targets_next_tokens_and_stop_at_the_sequence_end():
    data = random_feature_set()
    batch = pack(data, [1], [[20]], BLOCK, VOCAB - 1)  # sequence 1 has 23 tokens: positions 21, 22 exist
    start = int(data.starts[1])
    assert batch.block_ids[0, 0] == data.token_ids[start + 20]
    assert (batch.block_ids[0, 1:BLOCK] == VOCAB - 1).all()
    assert batch.label_valid[0, 0].tolist() == [True, True] + [False] * (BLOCK - 3)
    assert batch.labels[0, 0, :2].tolist() == data.labels[start + 20 : start + 22].tolist()


def test_labels_stop_where_the_text_leaves_the_targets_greedy_path():
    """On text the target did not write, a label after a token the target would not choose is not greedy output."""
    data = random_feature_set()
    start, anchor = int(data.starts[0]), 5
    data.labels[start + anchor + 3] = (data.token_ids[start + anchor + 4] + 1) % (VOCAB - 1)  # target disagrees at +4
    batch = pack(data, [0], [[anchor]], BLOCK, VOCAB - 1)
    # labels k = 0..3 follow tokens that agree with the target; label 4 is its choice after a token it would not pick.
    assert batch.label_valid[0, 0].tolist() == [True] * 4 + [False] * (BLOCK - 5)
    assert greedy_path_length(data.token_ids, data.labels, start + anchor, 0) == 0


def test_heldout_answers_are_generated_answers_never_corpus_text():
    data = random_feature_set(lengths=[30] * 12, prompt_lens=[4] * 12)
    data.sources = ["shard-corpus-00000"] * 6 + ["shard-00000"] * 3 + ["shard-00008"] * 3
    train, heldout = split_sequences(data, 0.5, seed=0)
    assert heldout and all(data.is_generated_answer(i) for i in heldout)
    assert sorted(train + heldout) == list(range(12)) and not set(train) & set(heldout)
    train, heldout = split_sequences(data, 0.5, seed=0, heldout_shards=("shard-00008",))
    assert heldout == [9, 10, 11] and train == list(range(9))
    with pytest.raises(ValueError, match="not in the data"):
        split_sequences(data, 0.5, seed=0, heldout_shards=("shard-00099",))


def test_warm_start_takes_every_weight_and_refuses_another_shape(tmp_path):
    torch.manual_seed(0)
    source = DFlashDrafter(tiny_config())
    source.save_pretrained(tmp_path / "source")
    fresh = DFlashDrafter(tiny_config())
    initialize_from_drafter(fresh, tmp_path / "source")
    for (name, a), b in zip(source.state_dict().items(), fresh.state_dict().values()):
        torch.testing.assert_close(a, b, msg=name)
    with pytest.raises(ValueError, match="num_hidden_layers"):
        initialize_from_drafter(DFlashDrafter(tiny_config((FULL_ATTENTION,))), tmp_path / "source")


def test_acceptance_is_one_plus_the_leading_matches():
    data = random_feature_set()
    batch = pack(data, [0, 2], [[5], [4]], BLOCK, VOCAB - 1)
    logits = torch.full((2, 1, BLOCK - 1, VOCAB), -1.0)
    predicted = batch.labels.clone()
    predicted[0, 0, 3] = (predicted[0, 0, 3] + 1) % VOCAB  # first miss at draft 4 -> 3 kept + bonus
    predicted[1, 0, 0] = (predicted[1, 0, 0] + 1) % VOCAB  # miss at once -> bonus only
    logits.scatter_(-1, predicted[..., None], 1.0)
    assert acceptance_lengths(logits, batch).flatten().tolist() == [4, 1]


def with_soft_labels(data: FeatureSet, k: int = 4, seed: int = 0) -> FeatureSet:
    """Soft labels as `prepare` caches them: the top-k of a distribution whose argmax is each label."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(data.labels), VOCAB, generator=generator)
    logits.scatter_(1, data.labels[:, None], logits.max(dim=1, keepdim=True).values + 1.0)
    values, ids = torch.log_softmax(logits, dim=-1).topk(k, dim=-1)
    data.soft_ids, data.soft_logprobs = ids.to(torch.int32), values.to(torch.float16)
    return data


def test_soft_labels_line_up_with_the_hard_labels():
    data = with_soft_labels(random_feature_set())
    assert data.soft_label_k == 4
    batch = pack(data, [0, 2], [[5, 17], [4, 30]], BLOCK, VOCAB - 1)
    assert batch.soft_ids.shape == (*batch.labels.shape, 4)
    valid = batch.label_valid
    # The teacher's most likely token is the hard label wherever there is a label.
    assert torch.equal(batch.soft_ids[..., 0][valid], batch.labels[valid])
    start, p = int(data.starts[2]), 30
    count = int(valid[1, 1].sum())
    assert torch.equal(batch.soft_logprobs[1, 1, :count], data.soft_logprobs[start + p : start + p + count].float())


def test_distillation_loss_mixes_the_teachers_distribution_into_the_hard_loss():
    data = random_feature_set()
    batch = pack(data, [0, 1], [[5], [9]], BLOCK, VOCAB - 1)
    weights = position_weights(BLOCK, 7.0)
    logits = torch.randn(2, 1, BLOCK - 1, VOCAB, generator=torch.Generator().manual_seed(2))
    hard = weighted_loss(logits, batch, weights)
    reference = torch.nn.functional.cross_entropy(logits.flatten(0, 2), batch.labels.flatten(), reduction="none")
    w = (weights[None, None] * batch.label_valid).flatten()
    torch.testing.assert_close(hard, (reference * w).sum() / w.sum())
    assert weighted_loss(logits, batch, weights, soft_label_weight=0.5) == hard  # no soft labels: hard only

    # All the teacher's mass on the label: distilling is the hard loss.
    batch.soft_ids = torch.stack([batch.labels, (batch.labels + 1) % VOCAB], dim=-1)
    batch.soft_logprobs = torch.tensor([0.0, -1e4]).expand(*batch.labels.shape, 2).clone()
    torch.testing.assert_close(weighted_loss(logits, batch, weights, soft_label_weight=0.5), hard)
    # A near-tie: the distillation term is the cross-entropy to the teacher's renormalised top-2.
    batch.soft_logprobs = torch.log(torch.tensor([0.6, 0.4])).expand(*batch.labels.shape, 2).clone()
    logprobs = torch.log_softmax(logits, -1)
    soft = -(0.6 * logprobs.gather(-1, batch.soft_ids[..., :1]) + 0.4 * logprobs.gather(-1, batch.soft_ids[..., 1:])).squeeze(-1)
    expected = ((0.75 * reference.view(soft.shape) + 0.25 * soft).flatten() * w).sum() / w.sum()
    torch.testing.assert_close(weighted_loss(logits, batch, weights, soft_label_weight=0.25), expected)


def test_fit_distils_from_soft_labels(tmp_path):
    """With soft labels in the data and a weight, a training step uses them (its loss differs from hard-label training)."""
    hard, soft = _trainer(tmp_path / "hard"), _trainer(tmp_path / "soft")
    soft.cfg.soft_label_weight = 0.5
    with_soft_labels(soft.data)
    soft.data.soft_logprobs = torch.zeros_like(soft.data.soft_logprobs)  # a flat top-4: far from the hard label
    assert soft.train_step() != hard.train_step()


def test_train_cli_refuses_bad_soft_label_settings(tmp_path):
    from sglang_dflash.train.__main__ import main
    from sglang_dflash.train.data import write_features

    with pytest.raises(SystemExit):
        main(["prepare", "--soft-labels", "-1"])
    with pytest.raises(SystemExit):
        main(["fit", "--soft-label-weight", "1.5"])
    # Distilling from a data directory without soft labels: refused before the target loads.
    data = random_feature_set()
    (tmp_path / "data" / "features").mkdir(parents=True)
    write_features(tmp_path / "data" / "features" / "shard-00000.safetensors", {
        "token_ids": data.token_ids, "labels": data.labels, "features": data.features,
        "offsets": torch.cat([data.starts, data.lengths.sum()[None]]), "prompt_lens": data.prompt_lens})
    with pytest.raises(SystemExit, match="needs soft labels"):
        main(["fit", "--run-dir", str(tmp_path), "--soft-label-weight", "0.5", "--target", str(tmp_path / "no-target")])


def test_next_block_anchor_is_where_greedy_decoding_starts_after_the_first_miss():
    data = random_feature_set()
    batch = pack(data, [0, 1], [[5, 20], [7, 19]], BLOCK, VOCAB - 1)  # sequence 1 has 23 tokens
    logits = torch.zeros(*batch.labels.shape, VOCAB)
    logits.scatter_(-1, batch.labels[..., None], 1.0)  # every draft right ...
    logits[0, 0, 3] = 0.0
    logits[0, 0, 3, (batch.labels[0, 0, 3] + 1) % VOCAB] = 2.0  # ... but the fourth of the first block
    logits[1, 0, 0] = 0.0
    logits[1, 0, 0, (batch.labels[1, 0, 0] + 1) % VOCAB] = 2.0  # and the first of the third
    starts = next_block_anchors(data, [0, 1], logits, batch)
    # 3 drafts kept + the target's own token: the next block's anchor is that token, 4 after the anchor.
    assert starts[0] == [5 + 4, 20 + BLOCK]
    # No draft kept: the next block starts at the target's token right after the anchor; a block
    # running to the end of a sequence is clipped to the last anchor it allows.
    assert starts[1] == [8, 23 - 2]


def test_decode_anchor_share_trains_on_the_probed_decode_starts(tmp_path):
    trainer = _trainer(tmp_path)
    trainer.cfg.decode_anchor_share = 0.5
    sequences = trainer.train_ids[:2]
    state = trainer.rng.getstate()
    batch = trainer._training_batch(sequences)
    assert batch.anchor_positions.shape == (2, 4)
    trainer.rng.setstate(state)  # replay the same draws by hand: two random anchors, then two probes
    own = [sample_anchors(trainer.data, s, 2, trainer.rng) for s in sequences]
    probes = trainer._batch(sequences, 2, trainer.rng)
    with torch.no_grad():
        found = next_block_anchors(trainer.data, sequences, draft_logits(trainer.drafter, trainer.embed_weight, probes), probes)
    assert batch.anchor_positions.tolist() == [a + b for a, b in zip(own, found)]
    last = torch.tensor([last_anchor(trainer.data, s) for s in sequences])[:, None]
    later = batch.anchor_positions[:, 2:] > probes.anchor_positions
    assert (later | (batch.anchor_positions[:, 2:] == last)).all()  # past its probe, unless clipped at the end
    loss = trainer.train_step()
    assert loss == loss and loss > 0  # a finite loss, and the step ran on that batch


def test_position_weights_decay_from_one():
    weights = position_weights(16, 7.0)
    assert weights[0] == 1.0 and weights.shape == (15,)
    assert torch.allclose(weights[7], torch.exp(torch.tensor(-1.0)))
    assert (weights[1:] < weights[:-1]).all()


def _trainer(tmp_path, steps=6, seed=0, lr=3e-3, num_sequences=6):
    torch.manual_seed(seed)
    drafter = DFlashDrafter(tiny_config())
    lengths = [30, 23, 41, 35, 28, 33] * (num_sequences // 6)
    data = random_feature_set(lengths=lengths, prompt_lens=[5, 7, 4, 6, 3, 8] * (num_sequences // 6))
    cfg = FitConfig(steps=steps, sequences_per_step=2, anchors_per_sequence=4, eval_every=3, save_every=2,
                    heldout_fraction=0.2, eval_anchors=8, autocast_bf16=False, warmup_steps=2, lr=lr)
    embed = 0.3 * torch.randn(VOCAB, HIDDEN, generator=torch.Generator().manual_seed(1))
    return Trainer(drafter, embed, data, tmp_path, cfg)


def test_resume_after_a_kill_continues_exactly(tmp_path):
    straight = _trainer(tmp_path / "straight")
    for _ in range(4):
        straight.train_step()

    first = _trainer(tmp_path / "resumed")
    for _ in range(2):
        first.train_step()
    first.save()
    del first  # the "kill": only the checkpoint survives
    second = _trainer(tmp_path / "resumed", seed=123)  # a different fresh init must be overwritten
    assert second.resume() and second.step == 2
    for _ in range(2):
        second.train_step()
    for (name, a), b in zip(straight.drafter.state_dict().items(), second.drafter.state_dict().values()):
        torch.testing.assert_close(a, b, msg=name)


def test_fit_learns_exports_and_reports(tmp_path):
    """On answers that repeat one token (the target's next token is the current one), held-out acceptance must rise."""
    trainer = _trainer(tmp_path, steps=200, lr=1e-2, num_sequences=18)
    data = trainer.data
    tokens = torch.arange(len(data)) % 3  # every held-out answer repeats a token some training answer repeats
    data.token_ids = torch.cat([torch.full((int(n),), int(token)) for n, token in zip(data.lengths, tokens)])
    data.labels = data.token_ids.clone()
    trainer.eval_batches = trainer._heldout_batches()
    before = trainer.evaluate()
    metrics = trainer.fit()
    assert metrics["heldout_acceptance"] > before["heldout_acceptance"] + 1.0
    # The replayed decode of the held-out answers rises too, and it is what picked the export.
    assert metrics["heldout_replay"] > before["heldout_replay"] + 1.0
    assert trainer.best_acceptance == max(m["heldout_replay"] for m in trainer.history)
    exported = DFlashDrafter.from_pretrained(tmp_path / "drafter")
    assert exported.config.block_size == BLOCK
    assert (tmp_path / "checkpoints" / "last.pt").exists()


@pytest.mark.parametrize("mix", ["v1", "v2"])
def test_training_prompts_are_balanced_and_not_benchmark_rows(mix):
    prompts = training_prompts(3200, seed=0, mix=mix)
    assert len(prompts) == len(set(prompts)) == 3200
    head = prompts[:500]
    boxed = sum("\\boxed{}" in p for p in head)
    code = sum("```python" in p or p.lower().startswith(("write a function", "write a python", "create a function"))
               for p in head)
    assert 150 <= boxed <= 250 and 150 <= code <= 250
    shared = Path(__file__).resolve().parents[1] / ".." / "shared" / "datasets"
    files = sorted(shared.glob("*.jsonl")) or sorted((Path(__file__).resolve().parents[1] / "benchmarks" / "data").glob("*.jsonl"))
    assert files, "benchmark sets not found"
    benchmark_turns = {turn for f in files for line in f.read_text().splitlines() for turn in json.loads(line)["turns"]}
    assert not benchmark_turns & set(prompts)
    if mix == "v2":  # GSM8K's training questions, never its test questions
        gsm8k_test = {turn.split("\nPlease reason")[0] for f in files if f.stem == "gsm8k"
                      for line in f.read_text().splitlines() for turn in json.loads(line)["turns"]}
        assert len(gsm8k_train_questions()) == 7473 and not gsm8k_test & set(gsm8k_train_questions())
        assert sum(p.split("\nPlease reason")[0] in set(gsm8k_train_questions()) for p in head) >= 70


def test_new_prompts_skip_those_already_answered(tmp_path):
    responses = tmp_path / "responses"
    responses.mkdir()
    answered = training_prompts(10, seed=0)[:4]
    (responses / "shard-00000.jsonl").write_text("".join(json.dumps({"prompt": p, "response_ids": [1]}) + "\n" for p in answered))
    assert answered_prompts(tmp_path) == frozenset(answered)
    fresh = training_prompts(10, seed=0, exclude=answered_prompts(tmp_path))
    assert len(fresh) == 10 and not set(answered) & set(fresh)
    with pytest.raises(ValueError, match="unknown prompt mix"):
        training_prompts(3, mix="v9")


@pytest.mark.slow
def test_prepare_writes_resumable_shards(tmp_path, checkpoints):
    """A tiny random target with SmolLM2's tokenizer answers prompts; shards are reused on a second run."""
    from sglang_dflash.targets import TargetModel, load_tokenizer, smollm2_hf_dir

    target_dir = checkpoints.target("llama", tokenizer_from=smollm2_hf_dir())
    target = TargetModel.from_pretrained(target_dir)
    tokenizer = load_tokenizer(target_dir)
    prompts = training_prompts(6, seed=1)
    assert prepare(tmp_path, target, tokenizer, prompts, [1, 2], shard_size=3, max_new_tokens=8, soft_label_k=16) == 2
    stamps = {p: p.stat().st_mtime_ns for p in (tmp_path / "features").iterdir()}
    assert prepare(tmp_path, target, tokenizer, prompts, [1, 2], shard_size=3, max_new_tokens=8, soft_label_k=16) == 2
    assert stamps == {p: p.stat().st_mtime_ns for p in (tmp_path / "features").iterdir()}
    data = FeatureSet.load(tmp_path)
    assert len(data) == 6 and data.features.shape == (int(data.lengths.sum()), 2 * target.hidden_size)
    # Soft labels: the target's top 16 at every token, its argmax first.
    assert data.soft_label_k == 16 and torch.equal(data.soft_ids[:, 0].long(), data.labels)
    assert (data.soft_logprobs[:, :-1] >= data.soft_logprobs[:, 1:]).all() and (data.soft_logprobs <= 0).all()
    rows = [json.loads(line) for line in (tmp_path / "responses" / "shard-00000.jsonl").read_text().splitlines()]
    first = rows[0]
    ids = first["prompt_ids"] + first["response_ids"]
    assert data.token_ids[: len(ids)].tolist() == ids
    # The cached labels are the target's own greedy tokens: they reproduce its answer.
    p = len(first["prompt_ids"])
    assert data.labels[p - 1 : len(ids) - 1].tolist() == first["response_ids"]

    # Archived answers replace generation on another machine: with max_new_tokens=1 a generated
    # answer would be one token long, so equal features prove that the archived answers were used.
    archive_responses(tmp_path, tmp_path / "archive")
    elsewhere = tmp_path / "elsewhere"
    assert len(import_responses(tmp_path / "archive", elsewhere)) == 2
    assert prepare(elsewhere, target, tokenizer, prompts, [1, 2], shard_size=3, max_new_tokens=1) == 2
    again = FeatureSet.load(elsewhere)
    assert torch.equal(again.token_ids, data.token_ids) and torch.equal(again.features, data.features)
    # A data directory made without soft labels gains them later; its features stay untouched.
    plain = tmp_path / "plain"
    import_responses(tmp_path / "archive", plain)
    assert prepare(plain, target, tokenizer, prompts, [1, 2], shard_size=3, max_new_tokens=8) == 2  # none by default
    assert FeatureSet.load(plain).soft_ids is None
    (plain / "soft_labels" / "shard-00000.safetensors").write_bytes(
        (tmp_path / "soft_labels" / "shard-00000.safetensors").read_bytes())
    with pytest.raises(FileNotFoundError, match="soft labels missing for 1 shards"):
        FeatureSet.load(plain)
    assert FeatureSet.load(plain, soft_labels=False).soft_ids is None  # hard-label training does not care
    stamps = {p: p.stat().st_mtime_ns for p in (plain / "features").iterdir()}
    assert prepare(plain, target, tokenizer, prompts, [1, 2], shard_size=3, max_new_tokens=8, soft_label_k=16) == 2
    assert stamps == {p: p.stat().st_mtime_ns for p in (plain / "features").iterdir()}
    added = FeatureSet.load(plain)
    assert torch.equal(added.soft_ids, data.soft_ids) and torch.equal(added.soft_logprobs, data.soft_logprobs)
    # --no-answers: only shards already answered are featurized, nothing is generated.
    assert prepare(tmp_path / "none", target, tokenizer, prompts, [1, 2], shard_size=3, max_new_tokens=8, generate=False) == 0
    assert not list((tmp_path / "none" / "responses").iterdir())


def test_answer_archive_round_trip_never_overwrites(tmp_path):
    responses = tmp_path / "run" / "responses"
    responses.mkdir(parents=True)
    for index in range(2):
        (responses / f"shard-0000{index}.jsonl").write_text(json.dumps({"prompt": f"p{index}", "response_ids": [index]}) + "\n")
    archive = tmp_path / "archive"
    assert [p.name for p in archive_responses(tmp_path / "run", archive)] == ["shard-00000.jsonl.gz", "shard-00001.jsonl.gz"]
    assert archive_responses(tmp_path / "run", archive) == []  # already archived
    target = tmp_path / "new"
    (target / "responses").mkdir(parents=True)
    (target / "responses" / "shard-00001.jsonl").write_text("kept\n")
    assert [p.name for p in import_responses(archive, target)] == ["shard-00000.jsonl"]
    assert (target / "responses" / "shard-00000.jsonl").read_bytes() == (responses / "shard-00000.jsonl").read_bytes()
    assert (target / "responses" / "shard-00001.jsonl").read_text() == "kept\n"
    with pytest.raises(FileNotFoundError, match="no answer shards"):
        import_responses(tmp_path / "empty", target)


@pytest.mark.parametrize("avx512_bf16, amx, expected", [
    (False, False, torch.float32), (True, False, torch.bfloat16), (False, True, torch.bfloat16),
])
def test_training_runs_bf16_only_where_the_cpu_has_it_natively(monkeypatch, avx512_bf16, amx, expected):
    # An AVX2-only CPU emulates bf16 (a matmul is ~4x slower than float32 there), so it must get float32.
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    assert training_dtype("cpu") == expected
    assert native_bfloat16("cpu") == (expected == torch.bfloat16)
    assert training_dtype("cuda") == torch.bfloat16  # a GPU: no probe needed, none runs


def test_train_cli_leaves_precision_to_the_device_unless_asked():
    from sglang_dflash.train.__main__ import build_parser

    auto = build_parser().parse_args(["fit"])
    assert auto.data_dtype is None and auto.bf16_autocast is None
    forced = build_parser().parse_args(["all", "--data-dtype", "bfloat16", "--no-bf16-autocast"])
    assert forced.data_dtype == "bfloat16" and forced.bf16_autocast is False


def test_archive_stage_of_the_cli(tmp_path, capsys):
    from sglang_dflash.train.__main__ import main

    (tmp_path / "run" / "data" / "responses").mkdir(parents=True)
    (tmp_path / "run" / "data" / "responses" / "shard-00000.jsonl").write_text("{}\n")
    assert main(["archive", "--run-dir", str(tmp_path / "run"), "--to", str(tmp_path / "archive")]) == 0
    assert "1 answer shards archived" in capsys.readouterr().out
    assert (tmp_path / "archive" / "shard-00000.jsonl.gz").exists()
    with pytest.raises(SystemExit, match="needs --to"):
        main(["archive", "--run-dir", str(tmp_path / "run")])


def test_lazy_leading_matches_equal_the_acceptance_rule():
    """`replay.leading_matches` computes a row's logits only while it matches; the lengths must not change."""
    from types import SimpleNamespace

    from sglang_dflash.train.replay import leading_matches

    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(6, BLOCK - 1, VOCAB, generator=generator)
    labels = logits.argmax(-1)
    for row, miss in enumerate([0, 2, 5, BLOCK - 2, None, 1]):
        if miss is not None:
            labels[row, miss] = (labels[row, miss] + 1) % VOCAB
    valid = torch.ones_like(labels, dtype=torch.bool)
    valid[4, 4:] = False  # the answer ends after 4 labels
    batch = SimpleNamespace(labels=labels[:, None], label_valid=valid[:, None])
    head_is_identity = SimpleNamespace(logits=lambda hidden, head: hidden)  # hidden states stand in for logits
    lazy, first_drafts = leading_matches(head_is_identity, torch.zeros(1), logits, labels, valid)
    assert first_drafts.tolist() == logits[:, 0].argmax(-1).tolist()
    assert lazy.tolist() == acceptance_lengths(logits[:, None], batch).flatten().tolist() == [1, 3, 6, BLOCK - 1, 5, 2]


@pytest.mark.slow
def test_replayed_decode_equals_the_reference_decoder_step_by_step():
    """Replaying greedy decoding on the target's cached answer gives the real decode's acceptance lengths."""
    from sglang_dflash.generate import encode, stop_ids
    from sglang_dflash.reference import ReferenceDecoder
    from sglang_dflash.targets import TargetModel, load_tokenizer, smollm2_hf_dir
    from sglang_dflash.train.replay import replay_acceptance

    shipped = Path(__file__).resolve().parents[1] / "python" / "sglang_dflash" / "assets" / "smollm2-dflash"
    tokenizer = load_tokenizer(smollm2_hf_dir())
    target = TargetModel.from_pretrained(smollm2_hf_dir(), dtype=torch.float32)
    drafter = DFlashDrafter.from_pretrained(shipped, dtype=torch.float32)
    prompt = encode(tokenizer, "Write a quicksort in Python.", chat=True)
    with torch.no_grad():
        (generation,) = ReferenceDecoder(target, drafter, 16).generate([prompt], 40, stop_token_ids=stop_ids(tokenizer, target))
        assert max(generation.acceptance_lengths) > 1, "a decode that accepts nothing would not test the replay"
        ids = torch.tensor(prompt + generation.output_ids)
        target.capture_layers(drafter.config.target_layer_ids)
        logits, features = target.forward(ids, torch.arange(len(ids)), target.new_cache())
    data = FeatureSet(token_ids=ids, labels=logits.argmax(-1), features=features, starts=torch.tensor([0]),
                      lengths=torch.tensor([len(ids)]), prompt_lens=torch.tensor([len(prompt)]))
    replayed = replay_acceptance(drafter, target.model.get_input_embeddings().weight.detach(), data, [0])
    assert replayed["acceptance_lengths"][0] == generation.acceptance_lengths
    assert replayed["committed_tokens"] == len(generation.output_ids) - 1


def test_confidence_bins_count_decode_starts_by_the_targets_probability():
    """Decode starts are walked from the replayed lengths; each lands in the bin of the target's label probability."""
    from sglang_dflash.train.diagnose import confidence_bins, format_table

    data = random_feature_set(lengths=(12,), prompt_lens=(3,))
    label_probs = torch.tensor([0.5] * 3 + [0.95, 0.4, 0.2, 0.95, 0.6, 0.1, 0.8, 0.3, 0.0])
    runner_up = torch.full((12,), VOCAB - 2)
    labels = data.labels.tolist()
    # Blocks anchored at 3, 5, 6 and 10: lengths 2, 1, 4 and 1 cover answer positions 3..10 (the last anchor is 10).
    replayed = {"acceptance_lengths": {0: [2, 1, 4, 1]},
                "first_drafts": {0: [labels[3], VOCAB - 2, labels[6], labels[10]]}}
    rows = confidence_bins(data, replayed, {0: (label_probs, runner_up)})
    by_low = {row["low"]: row for row in rows}
    assert sum(row["positions"] for row in rows) == 8  # positions 3..10
    assert [row["positions"] for row in rows] == [2, 2, 1, 1, 2]  # bins from 0.0 up
    assert by_low[0.9] == {"low": 0.9, "high": 1.0, "positions": 2, "decode_starts": 2,
                                "first_draft_right": 2, "first_draft_runner_up": 0}  # anchors 3 and 6
    assert (by_low[0.0]["decode_starts"], by_low[0.0]["first_draft_runner_up"]) == (1, 1)  # anchor 5 (p=0.2)
    assert (by_low[0.3]["decode_starts"], by_low[0.3]["first_draft_right"]) == (1, 1)  # anchor 10 (p=0.3)
    table = format_table(rows)
    assert table.splitlines()[-1] == "| all | 8 | 4 | 75% | 25% |"
    assert "| 0.9-1.0 | 25% | 50% (2) | 100% | 0% |" in table


@pytest.mark.slow
def test_diagnose_cli_bins_every_replayed_step(tmp_path, checkpoints, capsys):
    """End to end on a tiny random target's own answers: the bins hold every verify step of the replay."""
    from sglang_dflash.random_checkpoints import make_random_drafter
    from sglang_dflash.targets import TargetModel, load_tokenizer, smollm2_hf_dir
    from sglang_dflash.train.diagnose import label_confidence, main

    # Tied embeddings, as in SmolLM2: the drafter shares them as its input and LM head.
    target_dir = checkpoints.target("llama", tokenizer_from=smollm2_hf_dir(), tie_word_embeddings=True)
    target = TargetModel.from_pretrained(target_dir)
    assert prepare(tmp_path / "run" / "data", target, load_tokenizer(target_dir), training_prompts(4, seed=2), [1, 2],
                   shard_size=4, max_new_tokens=12) == 1
    drafter_dir = make_random_drafter(tmp_path / "drafter", hidden_size=target.hidden_size,
                                      num_target_layers=target.num_layers, vocab_size=target.vocab_size,
                                      target_layer_ids=[1, 2], block_size=4)
    out = tmp_path / "bins.json"
    assert main(["--drafter", str(drafter_dir), "--run-dir", str(tmp_path / "run"), "--target", str(target_dir),
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    steps = int(printed.split(" verify steps")[0].split()[-1])
    bins = json.loads(out.read_text())["bins"]
    assert sum(b["decode_starts"] for b in bins) == steps > 0
    data = FeatureSet.load(tmp_path / "run" / "data")
    assert sum(b["positions"] for b in bins) == int((data.lengths - data.prompt_lens - 1).sum())
    # The labels are this target's greedy tokens, so its probability of each is its largest one.
    label_probs, runner_up = label_confidence(target, data, 0)
    start, length = int(data.starts[0]), int(data.lengths[0])
    logits, _ = target.forward(data.token_ids[start : start + length], torch.arange(length), target.new_cache())
    assert torch.allclose(label_probs, torch.softmax(logits, -1).amax(-1), atol=1e-6)
    assert not torch.equal(runner_up, data.labels[start : start + length])
