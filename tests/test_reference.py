"""The reference decoder is lossless: greedy output equals target-only greedy output token for token."""

import pytest
import torch

from sglang_dflash.drafter import DFlashDrafter
from sglang_dflash.reference import ReferenceDecoder, generate_autoregressive
from sglang_dflash.targets import TargetModel

FAMILY_LAYERS = {"llama": 4, "qwen3": 4, "gemma3": 4, "gemma4": 6}


def _prompts(count, vocab, seed, lengths=(3, 40)):
    generator = torch.Generator().manual_seed(seed)
    sizes = torch.randint(lengths[0], lengths[1], (count,), generator=generator).tolist()
    return [torch.randint(3, vocab - 1, (n,), generator=generator).tolist() for n in sizes]


def _pair(checkpoints, family, kv_heads=2, draft_layers=2, block_size=16, sliding=True, draft_kv_heads=2):
    layers = FAMILY_LAYERS[family]
    target = TargetModel.from_pretrained(checkpoints.target(family, num_layers=layers, num_key_value_heads=kv_heads))
    kinds = (["sliding_attention"] * (draft_layers - 1) + ["full_attention"]) if sliding else None
    drafter = DFlashDrafter.from_pretrained(
        checkpoints.drafter(
            hidden_size=target.hidden_size,
            num_target_layers=target.num_layers,
            vocab_size=target.vocab_size,
            num_layers=draft_layers,
            num_kv_heads=draft_kv_heads,
            block_size=16,
            target_layer_ids=[0, layers // 2, layers - 1][: max(1, draft_layers)],
            layer_types=kinds,
            sliding_window=16 if sliding else None,
        )
    )
    return target, drafter


# family, target KV heads (of 4 query heads), draft KV heads, block size, batch size
CASES = [
    ("llama", 1, 1, 2, 1),
    ("llama", 4, 2, 16, 8),
    ("qwen3", 2, 4, 4, 3),
    ("qwen3", 1, 2, 16, 1),
    ("gemma3", 2, 1, 8, 8),
    ("gemma3", 4, 2, 2, 3),
    ("gemma4", 2, 2, 16, 3),
    ("gemma4", 1, 4, 4, 8),
]


@pytest.mark.parametrize("family, kv_heads, draft_kv_heads, block_size, batch", CASES)
def test_greedy_equals_target_only(checkpoints, family, kv_heads, draft_kv_heads, block_size, batch):
    target, drafter = _pair(checkpoints, family, kv_heads=kv_heads, draft_kv_heads=draft_kv_heads)
    prompts = _prompts(batch, target.vocab_size, seed=block_size + batch)
    speculative = ReferenceDecoder(target, drafter, block_size=block_size).generate(prompts, max_new_tokens=24)
    baseline = generate_autoregressive(target, prompts, max_new_tokens=24)
    for spec, ar in zip(speculative, baseline):
        assert spec.output_ids == ar.output_ids
        assert len(spec.output_ids) == 24 and spec.finish_reason == "length"
        assert sum(spec.acceptance_lengths) == len(spec.output_ids) - 1  # first token comes from prefill


class ProposesKnownContinuation(ReferenceDecoder):
    """A decoder whose drafts come from a known answer, corrupted at chosen rates.

    The drafter is replaced (a test double standing in for a trained drafter) so that every
    acceptance length from 1 to B occurs; verification and commit are the real ones.
    """

    def __init__(self, *args, answers, corrupt_rate, **kwargs):
        super().__init__(*args, **kwargs)
        self.answers, self.corrupt_rate = answers, corrupt_rate
        self.rng = torch.Generator().manual_seed(0)

    def _draft(self, active, positions):
        blocks = super()._draft(active, positions)
        for row, request in enumerate(active):
            answer = self.answers[request.prompt_index]
            done = len(request.output)
            for col in range(1, blocks.shape[1]):
                if done + col - 1 < len(answer) and torch.rand((), generator=self.rng) > self.corrupt_rate:
                    blocks[row, col] = answer[done + col - 1]
        return blocks


@pytest.mark.parametrize("family", ["qwen3", "gemma4"])
@pytest.mark.parametrize("corrupt_rate", [0.0, 0.1, 0.4])
def test_commit_is_exact_for_any_acceptance_pattern(checkpoints, family, corrupt_rate, monkeypatch):
    target, drafter = _pair(checkpoints, family)
    prompts = _prompts(5, target.vocab_size, seed=7)
    baseline = generate_autoregressive(target, prompts, max_new_tokens=40)
    decoder = ProposesKnownContinuation(
        target, drafter, block_size=8, answers=[g.output_ids for g in baseline], corrupt_rate=corrupt_rate
    )
    _tag_requests_with_prompt_index(monkeypatch, prompts)
    speculative = decoder.generate(prompts, max_new_tokens=40)
    lengths = [n for g in speculative for n in g.acceptance_lengths]
    for spec, ar in zip(speculative, baseline):
        assert spec.output_ids == ar.output_ids
    if corrupt_rate == 0.0:
        assert max(lengths) == 8 and sum(lengths) / len(lengths) > 6
    else:
        assert min(lengths) < max(lengths)


def _tag_requests_with_prompt_index(monkeypatch, prompts):
    import sglang_dflash.reference as reference

    lookup = {tuple(p): i for i, p in enumerate(prompts)}
    monkeypatch.setattr(reference._Request, "prompt_index", property(lambda self: lookup[tuple(self.prompt)]), raising=False)


def test_stop_tokens_and_length_limits_inside_a_block(checkpoints, monkeypatch):
    target, drafter = _pair(checkpoints, "qwen3")
    prompts = _prompts(3, target.vocab_size, seed=11)
    baseline = generate_autoregressive(target, prompts, max_new_tokens=30)
    _tag_requests_with_prompt_index(monkeypatch, prompts)
    decoder = ProposesKnownContinuation(target, drafter, block_size=8, answers=[g.output_ids for g in baseline], corrupt_rate=0.0)
    for limit in (1, 2, 7, 8, 9, 17):
        for spec, ar in zip(decoder.generate(prompts, max_new_tokens=limit), baseline):
            assert spec.output_ids == ar.output_ids[:limit] and spec.finish_reason == "length"
    # A stop token met in the middle of a fully accepted block ends the request right there.
    stop = baseline[0].output_ids[5]
    first_stop = baseline[0].output_ids.index(stop)
    spec = decoder.generate(prompts[:1], max_new_tokens=30, stop_token_ids=[stop])[0]
    assert spec.output_ids == baseline[0].output_ids[: first_stop + 1] and spec.finish_reason == "stop"
    ar = generate_autoregressive(target, prompts[:1], max_new_tokens=30, stop_token_ids=[stop])[0]
    assert ar.output_ids == spec.output_ids


def test_mismatched_pairs_are_refused(checkpoints):
    target, _ = _pair(checkpoints, "qwen3")
    wrong_layers = DFlashDrafter.from_pretrained(
        checkpoints.drafter(hidden_size=64, num_target_layers=6, vocab_size=512, target_layer_ids=[1])
    )
    with pytest.raises(ValueError, match="trained on 6 target layers, target has 4"):
        ReferenceDecoder(target, wrong_layers)
    wrong_hidden = DFlashDrafter.from_pretrained(
        checkpoints.drafter(hidden_size=32, num_target_layers=4, vocab_size=512, target_layer_ids=[1], head_dim=8)
    )
    with pytest.raises(ValueError, match="hidden size 32 != target 64"):
        ReferenceDecoder(target, wrong_hidden)
    _, drafter = _pair(checkpoints, "qwen3")
    with pytest.raises(ValueError, match="trained block size"):
        ReferenceDecoder(target, drafter, block_size=32)


def test_smollm2_with_a_random_drafter_is_lossless(smollm2, checkpoints):
    from sglang_dflash.targets import load_tokenizer

    tokenizer = load_tokenizer("smollm2")
    drafter = DFlashDrafter.from_pretrained(
        checkpoints.drafter(
            hidden_size=smollm2.hidden_size,
            num_target_layers=smollm2.num_layers,
            vocab_size=smollm2.vocab_size,
            num_layers=1,
            num_heads=9,
            num_kv_heads=3,
            head_dim=64,
        )
    )
    texts = ["Write a quicksort in Python.", "What is the capital of France?", "Count from 1 to 5."]
    prompts = [
        list(tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True)["input_ids"])
        for t in texts
    ]
    speculative = ReferenceDecoder(smollm2, drafter).generate(prompts, max_new_tokens=20, stop_token_ids=[2])
    baseline = generate_autoregressive(smollm2, prompts, max_new_tokens=20, stop_token_ids=[2])
    assert [g.output_ids for g in speculative] == [g.output_ids for g in baseline]
