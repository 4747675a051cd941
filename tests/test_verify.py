"""The acceptance rule on hand-made blocks, and the sampling rule's exactness on synthetic laws."""

import torch

from sglang_dflash.sampling import draw, probabilities
from sglang_dflash.verify import verify_block, verify_greedy, verify_sampling


def test_greedy_accepts_the_matching_prefix_then_the_targets_token():
    blocks = torch.tensor([[7, 1, 2, 3, 4], [7, 1, 2, 3, 4], [7, 1, 2, 3, 4], [7, 1, 2, 3, 4]])
    target = torch.tensor([[1, 2, 3, 4, 5], [9, 2, 3, 4, 5], [1, 2, 8, 4, 5], [1, 2, 3, 4, 5]])
    lens = torch.tensor([5, 5, 5, 3])
    result = verify_greedy(blocks, target, lens)
    assert result.accept_lens.tolist() == [5, 1, 3, 3]
    emitted = [row[:n] for row, n in zip(result.emitted.tolist(), result.accept_lens.tolist())]
    # all kept + bonus; first draft wrong; two kept then the target's 8; block cut to 3 columns
    assert emitted == [[1, 2, 3, 4, 5], [9], [1, 2, 8], [1, 2, 3]]


def test_block_of_one_is_plain_decoding():
    result = verify_greedy(torch.tensor([[7, 0, 0]]), torch.tensor([[4, 5, 6]]), torch.tensor([1]))
    assert result.accept_lens.tolist() == [1] and result.emitted[0, 0] == 4


def test_probabilities_apply_temperature_top_k_top_p():
    logits = torch.tensor([[[4.0, 3.0, 2.0, 1.0, 0.0]]]).repeat(3, 1, 1)
    temperature = torch.tensor([1.0, 1.0, 0.5])
    top_p = torch.tensor([1.0, 0.8, 1.0])
    top_k = torch.tensor([2, 0, 0])
    probs = probabilities(logits, temperature, top_p, top_k)[:, 0]
    soft = logits[0, 0].softmax(-1)
    torch.testing.assert_close(probs[0], torch.cat([soft[:2] / soft[:2].sum(), torch.zeros(3)]))
    # top-p 0.8: the smallest prefix of the sorted law reaching 0.8 (0.636 + 0.234 >= 0.8)
    torch.testing.assert_close(probs[1], torch.cat([soft[:2] / soft[:2].sum(), torch.zeros(3)]))
    torch.testing.assert_close(probs[2], (logits[0, 0] / 0.5).softmax(-1))


def test_draw_never_picks_a_zero_mass_token():
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0]]).repeat(5, 1)
    tokens = draw(probs, torch.tensor([0.0, 0.25, 0.4999, 0.5, 0.99999]))
    assert tokens.tolist() == [1, 1, 1, 3, 3]


def _random_laws(rows, width, vocab, seed):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(1, width, vocab, generator=generator) * 1.5).softmax(-1).repeat(rows, 1, 1)


def test_sampling_rule_keeps_the_target_law_for_every_emitted_position():
    """Two drafts; tokens 1 and 2 of the step must follow p0 and p1(.|token 1) whatever the drafts."""
    rows, vocab = 200_000, 6
    probs = _random_laws(rows, 3, vocab, seed=0)
    generator = torch.Generator().manual_seed(1)
    blocks = torch.tensor([[0, 2, 4]]).repeat(rows, 1)
    result = verify_sampling(
        blocks, probs, torch.full((rows,), 3), torch.rand(rows, 2, generator=generator), torch.rand(rows, generator=generator)
    )
    first = result.emitted[:, 0]
    frequency = torch.bincount(first, minlength=vocab).float() / rows
    torch.testing.assert_close(frequency, probs[0, 0], atol=4e-3, rtol=0)
    # Given the first draft was accepted, the next token follows p1 (the law at column 1).
    kept_first = result.accept_lens >= 2
    second = result.emitted[kept_first, 1]
    frequency = torch.bincount(second, minlength=vocab).float() / second.numel()
    torch.testing.assert_close(frequency, probs[0, 1], atol=6e-3, rtol=0)


def test_mixed_batch_routes_greedy_rows_to_argmax():
    logits = torch.randn(2, 4, 10)
    blocks = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4]])
    blocks[0, 1:] = logits[0, :-1].argmax(-1)  # row 0 drafts exactly the target's argmax
    result = verify_block(
        blocks, logits, torch.tensor([4, 4]), torch.tensor([0.0, 1.0]), torch.ones(2), torch.zeros(2, dtype=torch.long)
    )
    assert result.accept_lens[0] == 4
    assert result.emitted[0, 3] == logits[0, 3].argmax()
