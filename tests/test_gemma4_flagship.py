"""The flagship pairing, scaled down: gemma-4-26B-A4B-it with its DFlash drafter (float32, CPU).

`random_checkpoints.make_gemma4_flagship_pair` keeps what makes the pair hard: the target's
5-sliding-1-full layer pattern with K=V full layers of their own head dim and KV heads, MoE
beside the dense MLP, the Gemma embedding scale and the final softcap; the drafter's published
format (4 sliding + 1 full layer, block 16, mask id 4, six target layers, softcap 30). Through the
Gemma-style chat template with `enable_thinking` on and off, greedy output must be the target's
own token for token: the reference decoder against HF greedy, and a real SGLang server with our
worker against a plain SGLang server and HF greedy, at concurrency 1 and 8.
"""

from __future__ import annotations

import concurrent.futures as futures
import math

import openai
import pytest
import torch

from sglang_dflash.drafter import DFlashDrafter
from sglang_dflash.launch import launch_server
from sglang_dflash.random_checkpoints import make_gemma4_flagship_pair
from sglang_dflash.reference import ReferenceDecoder, generate_autoregressive
from sglang_dflash.targets import TargetModel, load_tokenizer, smollm2_hf_dir

BLOCK = 16
MAX_NEW = 12
PROMPTS = [
    "Write a quicksort in Python.",
    "What is the capital of France?",
    "Count from 1 to 10.",
    "Name three colors.",
    "Give me a haiku about the sea.",
    "What is 12 times 7?",
    "Why is the sky blue?",
    "What does HTTP stand for?",
]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return make_gemma4_flagship_pair(tmp_path_factory.mktemp("gemma4-flagship"), smollm2_hf_dir())


@pytest.fixture(scope="module")
def hf_target(pair):
    return TargetModel.from_pretrained(pair[0], dtype=torch.float32)


@pytest.fixture(scope="module")
def tokenizer(pair):
    return load_tokenizer(pair[0])


def chat_ids(tokenizer, text, thinking):
    encoded = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, enable_thinking=thinking
    )
    return list(encoded["input_ids"])


def test_chat_template_honours_enable_thinking(tokenizer):
    thinking, plain = (tokenizer.decode(chat_ids(tokenizer, PROMPTS[0], flag)) for flag in (True, False))
    assert "<|think|>" in thinking and "<|think|>" not in plain
    assert thinking.endswith("<start_of_turn>model\n") and plain.endswith("<start_of_turn>model\n")


def test_pair_has_the_flagship_structure(pair, hf_target):
    config = hf_target.model.config
    full = [i for i, kind in enumerate(config.layer_types) if kind == "full_attention"]
    assert full == [5, 11] and config.attention_k_eq_v and config.enable_moe_block
    assert config.final_logit_softcapping == 30.0
    assert hf_target.model.model.layers[5].self_attn.v_proj is None  # keys are the values
    drafter = DFlashDrafter.from_pretrained(pair[1])
    assert drafter.config.layer_types == ["sliding_attention"] * 4 + ["full_attention"]
    assert drafter.config.mask_token_id == 4 and drafter.config.block_size == BLOCK
    assert drafter.config.final_logit_softcapping == 30.0 and drafter.config.sliding_window >= BLOCK


def test_draft_embedding_is_scaled_once_and_draft_logits_are_softcapped(pair, hf_target):
    ids = torch.tensor([[4, 17, 300]])
    table = hf_target.model.get_input_embeddings().weight
    # The target's own embedding module carries Gemma's sqrt(hidden) scale; the drafter is fed
    # exactly that and never scales again.
    assert torch.allclose(hf_target.embed(ids), table[ids] * math.sqrt(hf_target.hidden_size), rtol=1e-5)
    drafter = DFlashDrafter.from_pretrained(pair[1])
    hidden = torch.randn(1, 3, hf_target.hidden_size) * 50
    raw = hf_target.lm_head(hidden)
    assert raw.abs().max() > 30  # the cap is actually exercised
    assert torch.allclose(drafter.logits(hidden, hf_target.lm_head), 30 * torch.tanh(raw / 30), atol=1e-4)


@pytest.mark.parametrize("thinking", [False, True], ids=["no-thinking", "thinking"])
@pytest.mark.parametrize("batch", [1, 8])
def test_reference_decoder_equals_hf_greedy(pair, hf_target, tokenizer, thinking, batch):
    drafter = DFlashDrafter.from_pretrained(pair[1])
    prompts = [chat_ids(tokenizer, text, thinking) for text in PROMPTS[:batch]]
    stops = [tokenizer.eos_token_id]
    speculative = ReferenceDecoder(hf_target, drafter, block_size=BLOCK).generate(
        prompts, max_new_tokens=MAX_NEW, stop_token_ids=stops
    )
    baseline = generate_autoregressive(hf_target, prompts, max_new_tokens=MAX_NEW, stop_token_ids=stops)
    assert [r.output_ids for r in speculative] == [r.output_ids for r in baseline]


# ---------------------------------------------------------------------------- real servers
@pytest.fixture(scope="module")
def plain_server(pair, tmp_path_factory):
    with launch_server(pair[0], ["--max-running-requests", "8"], log_dir=tmp_path_factory.mktemp("plain")) as server:
        yield server


@pytest.fixture(scope="module")
def dflash_server(pair, tmp_path_factory):
    args = [
        "--speculative-algorithm", "DFLASH",
        "--speculative-draft-model-path", str(pair[1]),
        "--speculative-num-draft-tokens", str(BLOCK),
        "--max-running-requests", "8",
    ]  # fmt: skip
    with launch_server(pair[0], args, log_dir=tmp_path_factory.mktemp("dflash")) as server:
        yield server


def chat_all(server, prompts, thinking, concurrency):
    """(content, prompt tokens, completion tokens) per prompt through the OpenAI client."""
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="none")

    def ask(text):
        reply = client.chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": text}],
            temperature=0,
            max_tokens=MAX_NEW,
            extra_body={"chat_template_kwargs": {"enable_thinking": thinking}},
        )
        return reply.choices[0].message.content, reply.usage.prompt_tokens, reply.usage.completion_tokens

    with futures.ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(ask, prompts))


def hf_answers(hf_target, tokenizer, prompts, thinking):
    ids = [chat_ids(tokenizer, text, thinking) for text in prompts]
    outputs = generate_autoregressive(hf_target, ids, max_new_tokens=MAX_NEW, stop_token_ids=[tokenizer.eos_token_id])
    return [
        (tokenizer.decode(out.output_ids, skip_special_tokens=True), len(prompt), len(out.output_ids))
        for prompt, out in zip(ids, outputs)
    ]


@pytest.mark.server
@pytest.mark.parametrize("thinking", [False, True], ids=["no-thinking", "thinking"])
@pytest.mark.parametrize("concurrency", [1, 8])
def test_server_with_our_worker_equals_plain_server_and_hf(
    hf_target, tokenizer, plain_server, dflash_server, thinking, concurrency
):
    prompts = PROMPTS[:2] if concurrency == 1 else PROMPTS
    expected = hf_answers(hf_target, tokenizer, prompts, thinking)
    assert chat_all(plain_server, prompts, thinking, concurrency) == expected
    assert chat_all(dflash_server, prompts, thinking, concurrency) == expected
    log = dflash_server.log_path.read_text(errors="replace")
    assert "DFLASH served by our worker" in log
    # The Gemma-4 target runs SGLang's torch_native backend, which our TARGET_VERIFY path extends.
    assert "fallback to torch_native" in log
