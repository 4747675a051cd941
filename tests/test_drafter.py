import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from sglang_dflash.drafter import DFlashCheckpointError, DFlashDrafter, DraftContext

HIDDEN, TARGET_LAYERS, VOCAB = 64, 4, 512


def _drafter_dir(checkpoints, **kwargs):
    base = dict(hidden_size=HIDDEN, num_target_layers=TARGET_LAYERS, vocab_size=VOCAB, target_layer_ids=[1, 3])
    return checkpoints.drafter(**{**base, **kwargs})


def _context(drafter, length, seed):
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(length, drafter.config.num_context_features, generator=generator)
    positions = torch.arange(length)
    context = DraftContext()
    context.append(drafter.context_keys_values(features, positions), positions)
    return context


def _block(drafter, batch, start_positions, seed):
    generator = torch.Generator().manual_seed(seed)
    embeddings = torch.randn(batch, drafter.block_size, HIDDEN, generator=generator)
    positions = torch.tensor(start_positions)[:, None] + torch.arange(drafter.block_size)[None]
    return embeddings, positions


@pytest.mark.parametrize("shards", [1, 3])
def test_save_load_round_trip(checkpoints, shards):
    path = _drafter_dir(checkpoints, num_layers=2, block_size=8, shards=shards)
    if shards > 1:
        assert (path / "model.safetensors.index.json").exists()
    drafter = DFlashDrafter.from_pretrained(path)
    rebuilt = DFlashDrafter(drafter.config)
    rebuilt.load_state_dict(drafter.state_dict())
    context = _context(drafter, 10, seed=0)
    embeddings, positions = _block(drafter, 1, [10], seed=1)
    assert torch.equal(drafter(embeddings, positions, [context]), rebuilt(embeddings, positions, [context]))


def test_batched_ragged_contexts_equal_single_requests(checkpoints):
    drafter = DFlashDrafter.from_pretrained(
        _drafter_dir(checkpoints, num_layers=2, block_size=8, layer_types=["sliding_attention", "full_attention"], sliding_window=8)
    )
    lengths = [3, 17, 9]
    contexts = [_context(drafter, n, seed=n) for n in lengths]
    embeddings, positions = _block(drafter, len(lengths), lengths, seed=5)
    batched = drafter(embeddings, positions, contexts)
    for row, context in enumerate(contexts):
        alone = drafter(embeddings[row : row + 1], positions[row : row + 1], [context])
        torch.testing.assert_close(batched[row : row + 1], alone, rtol=1e-5, atol=1e-5)


def test_context_built_incrementally_equals_one_shot(checkpoints):
    drafter = DFlashDrafter.from_pretrained(_drafter_dir(checkpoints, num_layers=2, block_size=8))
    features = torch.randn(12, drafter.config.num_context_features)
    positions = torch.arange(12)
    whole, pieces = DraftContext(), DraftContext()
    whole.append(drafter.context_keys_values(features, positions), positions)
    for lo, hi in [(0, 5), (5, 6), (6, 12)]:
        pieces.append(drafter.context_keys_values(features[lo:hi], positions[lo:hi]), positions[lo:hi])
    for a, b in zip(whole.keys + whole.values, pieces.keys + pieces.values):
        torch.testing.assert_close(a, b)
    pieces.crop(5)
    assert len(pieces) == 5


def test_sliding_layers_see_only_their_window(checkpoints):
    drafter = DFlashDrafter.from_pretrained(
        _drafter_dir(checkpoints, num_layers=1, block_size=8, layer_types=["sliding_attention"], sliding_window=8)
    )
    context = _context(drafter, 20, seed=3)
    embeddings, positions = _block(drafter, 1, [20], seed=4)
    reference = drafter(embeddings, positions, [context])
    far, near = _context(drafter, 20, seed=3), _context(drafter, 20, seed=3)
    for layer in range(len(drafter.layers)):
        far.keys[layer][:13] += 5.0  # positions 0..12: at least 8 away from every block position (>= 20)
        near.keys[layer][18] += 5.0  # position 18 is inside the window of the first block tokens
    assert torch.equal(drafter(embeddings, positions, [far]), reference)
    assert not torch.allclose(drafter(embeddings, positions, [near]), reference)


@pytest.mark.parametrize("causal", [False, True])
def test_block_is_non_causal_unless_configured(checkpoints, causal, tmp_path):
    path = _drafter_dir(checkpoints, num_layers=1, block_size=8)
    if causal:
        raw = json.loads((path / "config.json").read_text())
        raw["is_causal"] = True
        causal_dir = tmp_path / "causal"
        causal_dir.mkdir()
        (causal_dir / "config.json").write_text(json.dumps(raw))
        (causal_dir / "model.safetensors").write_bytes((path / "model.safetensors").read_bytes())
        path = causal_dir
    drafter = DFlashDrafter.from_pretrained(path)
    context = _context(drafter, 6, seed=0)
    embeddings, positions = _block(drafter, 1, [6], seed=1)
    changed = embeddings.clone()
    changed[0, -1] += 1.0  # perturb the last block token only
    first_before = drafter(embeddings, positions, [context])[0, 0]
    first_after = drafter(changed, positions, [context])[0, 0]
    assert torch.equal(first_before, first_after) == causal


def _copy_checkpoint(src, dst, tensors=None, config=None):
    dst.mkdir()
    (dst / "config.json").write_text(config if config is not None else (src / "config.json").read_text())
    if tensors is not None:
        save_file(tensors, str(dst / "model.safetensors"))
    return dst


def test_bad_checkpoints_fail_with_a_clear_list(checkpoints, tmp_path):
    good = _drafter_dir(checkpoints, num_layers=2, block_size=8)
    tensors = load_file(str(good / "model.safetensors"))

    missing = dict(tensors)
    del missing["layers.1.mlp.up_proj.weight"], missing["fc.weight"]
    with pytest.raises(DFlashCheckpointError, match=r"missing tensors: \['fc.weight', 'layers.1.mlp.up_proj.weight'\]"):
        DFlashDrafter.from_pretrained(_copy_checkpoint(good, tmp_path / "missing", missing))

    unexpected = {**tensors, "lm_head.weight": torch.zeros(VOCAB, HIDDEN)}
    with pytest.raises(DFlashCheckpointError, match=r"unexpected tensors: \['lm_head.weight'\]"):
        DFlashDrafter.from_pretrained(_copy_checkpoint(good, tmp_path / "unexpected", unexpected))

    misshaped = {**tensors, "fc.weight": torch.zeros(HIDDEN, HIDDEN)}
    with pytest.raises(DFlashCheckpointError, match=r"fc.weight: expected \(64, 128\), found \(64, 64\)"):
        DFlashDrafter.from_pretrained(_copy_checkpoint(good, tmp_path / "misshaped", misshaped))

    prefixed = {f"model.{name}": t for name, t in tensors.items()}  # the optional `model.` prefix is accepted
    DFlashDrafter.from_pretrained(_copy_checkpoint(good, tmp_path / "prefixed", prefixed))

    with pytest.raises(DFlashCheckpointError, match="neither model.safetensors nor"):
        DFlashDrafter.from_pretrained(_copy_checkpoint(good, tmp_path / "no-weights"))

    sharded = _drafter_dir(checkpoints, num_layers=2, block_size=8, shards=3)
    broken = _copy_checkpoint(sharded, tmp_path / "lost-shard")
    (broken / "model.safetensors.index.json").write_text((sharded / "model.safetensors.index.json").read_text())
    with pytest.raises(DFlashCheckpointError, match="shard files listed in the index are missing"):
        DFlashDrafter.from_pretrained(broken)

    with pytest.raises(FileNotFoundError, match="does not exist"):
        DFlashDrafter.from_pretrained(tmp_path / "nowhere")


@pytest.mark.parametrize("softcap", [None, 30.0])
def test_logits_of_a_strided_block_equal_row_by_row_head(checkpoints, softcap):
    # The head gets one flattened matrix (the fast CPU path); the result must be the head of each row.
    drafter = DFlashDrafter.from_pretrained(_drafter_dir(checkpoints))
    drafter.config.final_logit_softcapping = softcap
    head = torch.randn(VOCAB, HIDDEN, generator=torch.Generator().manual_seed(3))
    hidden = torch.randn(3, drafter.block_size, HIDDEN, generator=torch.Generator().manual_seed(4))[:, 1:]
    assert not hidden.is_contiguous()
    logits = drafter.logits(hidden, lambda rows: rows @ head.t())
    expected = torch.stack([torch.stack([row @ head.t() for row in block]) for block in hidden])
    if softcap:
        expected = torch.tanh(expected / softcap) * softcap
    assert logits.shape == (3, drafter.block_size - 1, VOCAB)
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
