"""Speculative sampling is exact: the first generated tokens follow the target's own law.

On a tiny-vocabulary target the exact law of the first three tokens is computed by enumeration;
samples from the reference decoder must pass a chi-square goodness-of-fit test, and a verifier
with a classic bug (drawing the replacement token from p instead of p without the rejected draft)
must fail the same test.
"""

import pytest
import torch
from scipy.stats import chi2

from sglang_dflash import verify
from sglang_dflash.drafter import DFlashDrafter
from sglang_dflash.reference import ReferenceDecoder
from sglang_dflash.sampling import SamplingParams, batch_params, draw, probabilities
from sglang_dflash.targets import TargetModel

VOCAB, PROMPT, SAMPLES, TOKENS = 8, [3, 1, 4, 1, 5], 2000, 3


def _law(target, context, params):
    logits, _ = target.forward(torch.tensor(context), torch.arange(len(context)), target.new_cache())
    temperature, top_p, top_k = batch_params([params])
    return probabilities(logits[-1].view(1, 1, -1), temperature, top_p, top_k)[0, 0]


@torch.inference_mode()
def exact_law(target, params):
    """P(t1, t2, t3) for every sequence of three tokens."""
    law = {}
    first = _law(target, PROMPT, params)
    for t1 in range(VOCAB):
        if first[t1] == 0:
            continue
        second = _law(target, PROMPT + [t1], params)
        for t2 in range(VOCAB):
            if second[t2] == 0:
                continue
            third = _law(target, PROMPT + [t1, t2], params)
            for t3 in range(VOCAB):
                law[(t1, t2, t3)] = float(first[t1] * second[t2] * third[t3])
    return law


def prefix_law(law, length):
    """The law of the first `length` tokens (a marginal of the three-token law)."""
    marginal = {}
    for cell, p in law.items():
        marginal[cell[:length]] = marginal.get(cell[:length], 0.0) + p
    return marginal


def p_values(samples, law):
    """Goodness of fit of the first two tokens and of all three (each a chi-square p-value)."""
    return [chi_square_p_value([s[:n] for s in samples], prefix_law(law, n)) for n in (2, TOKENS)]


def chi_square_p_value(samples, law):
    counts = {}
    for sample in samples:
        counts[tuple(sample)] = counts.get(tuple(sample), 0) + 1
    assert set(counts) <= set(law), "a sample the target gives zero probability"
    n = len(samples)
    observed, expected, pooled_obs, pooled_exp = [], [], 0, 0.0
    for cell, p in law.items():
        if n * p >= 5:
            observed.append(counts.get(cell, 0))
            expected.append(n * p)
        else:
            pooled_obs += counts.get(cell, 0)
            pooled_exp += n * p
    if pooled_exp > 0:
        observed.append(pooled_obs)
        expected.append(pooled_exp)
    statistic = sum((o - e) ** 2 / e for o, e in zip(observed, expected))
    return float(chi2.sf(statistic, len(observed) - 1))


def replacement_drawn_from_p(block_tokens, target_logits, block_lens, temperature, top_p, top_k, generator=None):
    """A deliberately wrong verifier: on rejection the new token is drawn from p, draft not removed."""
    probs = probabilities(target_logits, temperature, top_p, top_k)
    rows = torch.arange(block_tokens.shape[0])
    accept_uniforms = torch.rand(block_tokens.shape[0], block_tokens.shape[1] - 1, generator=generator)
    draft_probs = probs[:, :-1].gather(-1, block_tokens[:, 1:, None])[..., 0]
    columns = torch.arange(1, block_tokens.shape[1])[None, :] < block_lens[:, None]
    kept = verify._leading_true((accept_uniforms < draft_probs) & columns)
    token = draw(probs[rows, kept], torch.rand(block_tokens.shape[0], generator=generator))
    return verify._emit(block_tokens, kept, token)


@pytest.fixture(scope="module")
def pair(checkpoints):
    target = TargetModel.from_pretrained(checkpoints.target("qwen3", vocab_size=VOCAB, num_layers=2, initializer_range=0.05))
    drafter = DFlashDrafter.from_pretrained(
        checkpoints.drafter(hidden_size=64, num_target_layers=2, vocab_size=VOCAB, target_layer_ids=[0, 1], block_size=4)
    )
    return target, drafter


class DraftsAFixedToken(ReferenceDecoder):
    """Test double for the drafter: always proposes `token` first, so acceptance is frequent.

    Exactness must hold for any deterministic proposal; this one makes the accept branch common.
    """

    token = 0

    def _draft(self, active, positions):
        blocks = super()._draft(active, positions)
        blocks[:, 1] = self.token
        return blocks


def _likely_second_token(law):
    second = prefix_law(law, 2)
    return max(range(VOCAB), key=lambda t: sum(p for cell, p in second.items() if cell[1] == t))


def _speculative_samples(pair, params, verify_fn=verify.verify_block, fixed_draft=None):
    target, drafter = pair
    if fixed_draft is None:
        decoder = ReferenceDecoder(target, drafter, verify_fn=verify_fn)
    else:
        decoder = DraftsAFixedToken(target, drafter, verify_fn=verify_fn)
        decoder.token = fixed_draft
    generations = decoder.generate([PROMPT] * SAMPLES, max_new_tokens=TOKENS, sampling=params, seed=1234)
    return [g.output_ids for g in generations], [n for g in generations for n in g.acceptance_lengths]


@pytest.mark.parametrize("params", [SamplingParams(1.0), SamplingParams(0.8, top_p=0.9, top_k=5)])
def test_speculative_sampling_matches_the_target_law(pair, params):
    law = exact_law(pair[0], params)
    samples, lengths = _speculative_samples(pair, params)
    assert max(lengths) >= 2, "no draft was ever accepted: the test would not exercise acceptance"
    assert min(lengths) == 1, "no draft was ever rejected: the test would not exercise replacement"
    assert min(p_values(samples, law)) > 1e-3


@pytest.mark.parametrize("verify_fn, exact", [(verify.verify_block, True), (replacement_drawn_from_p, False)])
def test_frequent_acceptance_and_the_test_catches_a_wrong_verifier(pair, verify_fn, exact):
    params = SamplingParams(1.0)
    law = exact_law(pair[0], params)
    samples, lengths = _speculative_samples(pair, params, verify_fn, fixed_draft=_likely_second_token(law))
    assert sum(n > 1 for n in lengths) > len(lengths) // 10
    worst = min(p_values(samples, law))
    assert worst > 1e-3 if exact else worst < 1e-6
