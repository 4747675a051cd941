"""A plain (non-speculative) SGLang 0.5.23 server on the CPU gives exactly our target-only greedy tokens.

One float32 SmolLM2-135M-Instruct server is shared by the module. Its greedy output, through
POST /generate (token ids and text) and through the real `openai` client, must equal
`generate_autoregressive` on our own float32 HF copy of the same weights, for the same prompt ids.
"""

from __future__ import annotations

import pytest
import torch

from sglang_dflash.launch import launch_server
from sglang_dflash.reference import generate_autoregressive
from sglang_dflash.targets import load_tokenizer, smollm2_hf_dir

pytestmark = pytest.mark.server

MAX_NEW_TOKENS = 24
TEXT_PROMPTS = ["The capital of France is", "def fibonacci(n):\n    "]
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
]


@pytest.fixture(scope="module")
def server():
    with launch_server(smollm2_hf_dir()) as running:
        print(f"SGLang server ready in {running.startup_s:.1f} s, log {running.log_path}")
        yield running


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(smollm2_hf_dir())


@pytest.fixture(scope="module")
def stop_ids(tokenizer):
    """Token ids the server stops at by default: the EOS of the tokenizer and of generation_config."""
    from transformers import GenerationConfig

    eos = GenerationConfig.from_pretrained(smollm2_hf_dir()).eos_token_id
    eos = eos if isinstance(eos, list) else [eos]
    return sorted({tokenizer.eos_token_id, *eos})


@pytest.fixture(scope="module")
def expected(smollm2, stop_ids):
    """prompt ids -> our greedy output ids (float32, target only)."""
    cache: dict[tuple[int, ...], list[int]] = {}

    def run(prompt_ids: list[int]) -> list[int]:
        key = tuple(prompt_ids)
        if key not in cache:
            assert smollm2.model.dtype == torch.float32
            [generation] = generate_autoregressive(smollm2, [prompt_ids], MAX_NEW_TOKENS, stop_token_ids=stop_ids)
            cache[key] = generation.output_ids
        return cache[key]

    return run


def _generate(server, **request) -> dict:
    return server.post(
        "/generate", {**request, "sampling_params": {"temperature": 0, "max_new_tokens": MAX_NEW_TOKENS}}
    )


def _chat_prompt_ids(tokenizer, messages) -> list[int]:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False).input_ids


@pytest.mark.parametrize("prompt", TEXT_PROMPTS)
def test_generate_input_ids_equal_reference(server, tokenizer, expected, prompt):
    prompt_ids = tokenizer(prompt).input_ids
    answer = _generate(server, input_ids=prompt_ids, return_logprob=True)
    logprob_ids = [token for _, token, _ in answer["meta_info"]["output_token_logprobs"]]
    assert answer["meta_info"]["prompt_tokens"] == len(prompt_ids)
    assert answer["output_ids"] == logprob_ids
    assert answer["output_ids"] == expected(prompt_ids)


@pytest.mark.parametrize("prompt", TEXT_PROMPTS)
def test_generate_text_equals_reference(server, tokenizer, expected, prompt):
    prompt_ids = tokenizer(prompt).input_ids
    answer = _generate(server, text=prompt)
    assert answer["meta_info"]["prompt_tokens"] == len(prompt_ids)  # the server tokenizes like we do
    assert answer["output_ids"] == expected(prompt_ids)
    assert answer["text"] == tokenizer.decode(expected(prompt_ids), skip_special_tokens=True)


@pytest.mark.parametrize("messages", CHATS, ids=["france", "haiku"])
def test_openai_chat_equals_reference(server, tokenizer, expected, stop_ids, messages):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x")
    response = client.chat.completions.create(
        model=client.models.list().data[0].id, messages=messages, temperature=0, max_tokens=MAX_NEW_TOKENS
    )
    prompt_ids = _chat_prompt_ids(tokenizer, messages)
    want = expected(prompt_ids)
    assert response.usage.prompt_tokens == len(prompt_ids)  # same chat template, no extra BOS
    assert response.usage.completion_tokens == len(want)
    assert response.choices[0].message.content == tokenizer.decode(want, skip_special_tokens=True)
    assert response.choices[0].finish_reason == ("stop" if want[-1] in stop_ids else "length")
