"""Our worker inside a real SGLang server on 127.0.0.1 (CPU, float32) against a plain server.

Every request is sent to both servers and the answers must agree token for token: greedy
decoding through /generate and /v1/chat/completions, at concurrency 1 and 8, in the overlapped and
the synchronous schedule, streaming, and with stops and length limits that land inside a block.
Targets: SmolLM2-135M-Instruct with a random drafter, and a tiny random Qwen3 (SmolLM2's
tokenizer) with a random two-layer drafter that has a sliding-window layer.
"""

from __future__ import annotations

import concurrent.futures as futures
import http.client
import json
import time
import urllib.error

import openai
import pytest
from sglang_dflash.launch import launch_server

from sglang_dflash.random_checkpoints import make_random_drafter, make_random_target
from sglang_dflash.targets import load_tokenizer, smollm2_hf_dir

pytestmark = pytest.mark.server

BLOCK = 8
MAX_NEW = 32
PROMPTS = [
    "Write a quicksort in Python.",
    "What is the capital of France?",
    "Count from 1 to 10.",
    "Name three colors.",
    "Explain what a linked list is in two sentences.",
    "Translate 'good morning' into Spanish.",
    "Give me a haiku about the sea.",
    "What is 12 times 7?",
    "List the days of the week.",
    "Write a Python function that reverses a string.",
    "Why is the sky blue?",
    "Suggest a name for a pet turtle.",
    "What does HTTP stand for?",
    "Describe a cat in one sentence.",
    "Write a SQL query that counts rows in a table named users.",
    "What is the boiling point of water in Celsius?",
]


@pytest.fixture(scope="module", params=["smollm2", "tiny-qwen3"])
def pair(request, tmp_path_factory):
    """(target directory, drafter directory, tokenizer)."""
    root = tmp_path_factory.mktemp(request.param)
    smollm2 = smollm2_hf_dir()
    if request.param == "smollm2":
        target = smollm2
        drafter = make_random_drafter(
            root / "drafter", hidden_size=576, num_target_layers=30, vocab_size=49152,
            num_layers=1, num_heads=9, num_kv_heads=3, head_dim=64, block_size=16,
        )  # fmt: skip
    else:
        target = make_random_target("qwen3", root / "target", tokenizer_from=smollm2)
        drafter = make_random_drafter(
            root / "drafter", hidden_size=64, num_target_layers=4, vocab_size=49152, num_layers=2,
            layer_types=["sliding_attention", "full_attention"], sliding_window=16, block_size=16,
        )  # fmt: skip
    return target, drafter, load_tokenizer(target)


def dflash_args(drafter, block=BLOCK):
    return [
        "--speculative-algorithm", "DFLASH",
        "--speculative-draft-model-path", str(drafter),
        "--speculative-num-draft-tokens", str(block),
        "--max-running-requests", "8",
        "--chunked-prefill-size", "16",  # every chat prompt is prefilled in several chunks
    ]  # fmt: skip


@pytest.fixture(scope="module")
def plain_server(pair, tmp_path_factory):
    with launch_server(pair[0], ["--max-running-requests", "8"], log_dir=tmp_path_factory.mktemp("plain")) as server:
        yield server


@pytest.fixture(scope="module", params=["1", "0"], ids=["overlapped", "synchronous"])
def dflash_server(request, pair, tmp_path_factory):
    env = {"SGLANG_ENABLE_DFLASH_SPEC_V2": request.param}
    with launch_server(pair[0], dflash_args(pair[1]), env=env, log_dir=tmp_path_factory.mktemp("dflash")) as server:
        yield server


def chat_ids(tokenizer, text):
    encoded = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    return list(encoded["input_ids"])


def generate(server, input_ids, **sampling):
    sampling = {"temperature": 0, "max_new_tokens": MAX_NEW, **sampling}
    answer = server.post("/generate", {"input_ids": input_ids, "sampling_params": sampling})
    return answer["output_ids"], answer["meta_info"]


def generate_all(server, prompts, concurrency, **sampling):
    with futures.ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(lambda ids: generate(server, ids, **sampling)[0], prompts))


def test_generate_matches_plain_at_concurrency_1_and_8(pair, plain_server, dflash_server):
    prompts = [chat_ids(pair[2], text) for text in PROMPTS]
    expected = generate_all(plain_server, prompts, 8)
    assert generate_all(dflash_server, prompts, 1) == expected
    assert generate_all(dflash_server, prompts, 8) == expected
    # The same prompt again is a radix-cache hit: target KV and draft context both reused.
    again, meta = generate(dflash_server, prompts[0])
    assert meta["cached_tokens"] > 0 and again == expected[0]


def test_sampled_requests_beside_greedy_ones(pair, plain_server, dflash_server):
    prompts = [chat_ids(pair[2], text) for text in PROMPTS[:4]]
    expected = generate_all(plain_server, prompts, 4)
    sampling = {"temperature": 0.8, "top_p": 0.9, "top_k": 20}
    with futures.ThreadPoolExecutor(8) as pool:
        greedy = [pool.submit(generate, dflash_server, ids) for ids in prompts]
        sampled = [pool.submit(generate, dflash_server, ids, **sampling) for ids in prompts]
        assert [job.result()[0] for job in greedy] == expected
        for job in sampled:
            tokens, meta = job.result()
            assert 0 < len(tokens) <= MAX_NEW and all(0 <= t < len(pair[2]) for t in tokens)
            assert meta["finish_reason"]["type"] in ("length", "stop")


def test_chat_completions_and_streaming_match_plain(plain_server, dflash_server):
    clients = [openai.OpenAI(base_url=s.base_url + "/v1", api_key="none") for s in (plain_server, dflash_server)]
    for text in PROMPTS[:4]:
        messages = [{"role": "user", "content": text}]
        answers = [
            c.chat.completions.create(model="default", messages=messages, temperature=0, max_tokens=MAX_NEW)
            .choices[0]
            .message.content
            for c in clients
        ]
        assert answers[0] == answers[1]
        stream = clients[1].chat.completions.create(
            model="default", messages=messages, temperature=0, max_tokens=MAX_NEW, stream=True
        )
        streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
        assert streamed == answers[1]


@pytest.mark.parametrize("limit", [1, 2, BLOCK - 1, BLOCK, BLOCK + 1])
def test_max_tokens_inside_a_block(pair, plain_server, dflash_server, limit):
    for text in PROMPTS[:2]:
        ids = chat_ids(pair[2], text)
        expected, expected_meta = generate(plain_server, ids, max_new_tokens=limit)
        got, meta = generate(dflash_server, ids, max_new_tokens=limit)
        assert got == expected and meta["finish_reason"] == expected_meta["finish_reason"]
        assert meta["completion_tokens"] == len(expected)


def test_stop_tokens_and_strings_inside_a_block(pair, plain_server, dflash_server):
    ids = chat_ids(pair[2], PROMPTS[2])
    full, _ = generate(plain_server, ids)
    stop_token = full[5]
    for stop in ({"stop_token_ids": [stop_token]}, {"stop": [pair[2].decode(full[6:8])]}):
        expected, expected_meta = generate(plain_server, ids, **stop)
        got, meta = generate(dflash_server, ids, **stop)
        assert got == expected and meta["finish_reason"] == expected_meta["finish_reason"]


def test_speculative_metrics_are_reported(pair, dflash_server):
    _, meta = generate(dflash_server, chat_ids(pair[2], PROMPTS[0]), ignore_eos=True)
    assert meta["completion_tokens"] == MAX_NEW
    assert meta["spec_verify_ct"] >= 1
    # Each verify step commits accept_length tokens; the first token comes from prefill.
    assert meta["spec_accept_length"] == pytest.approx((MAX_NEW - 1) / meta["spec_verify_ct"], rel=0.2)
    assert 1.0 <= meta["spec_accept_length"] <= BLOCK


def _stream_then_hang_up(server, input_ids, chunks=3):
    """A client abort: open a streaming request, read a few chunks, close the connection."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    body = {"input_ids": input_ids, "stream": True, "sampling_params": {"temperature": 0, "max_new_tokens": 400, "ignore_eos": True}}
    connection.request("POST", "/generate", body=json.dumps(body), headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    for _ in range(chunks):
        response.readline()
    connection.close()


def test_aborts_and_finished_requests_leave_no_kv_in_use(pair, dflash_server):
    prompts = [chat_ids(pair[2], text) for text in PROMPTS[:6]]
    with futures.ThreadPoolExecutor(8) as pool:
        aborts = [pool.submit(_stream_then_hang_up, dflash_server, ids) for ids in prompts[:3]]
        finished = [pool.submit(generate, dflash_server, ids, max_new_tokens=n) for ids, n in zip(prompts, (3, 9, 17, 30))]
        stopped = [pool.submit(generate, dflash_server, prompts[4], stop_token_ids=[pair[2].eos_token_id])]
        for job in aborts + finished + stopped:
            job.result()
    # SGLang checks its KV and request pools whenever it goes idle (strict by default: a leak
    # kills the scheduler); give it time to go idle, then it must still serve and log no leak.
    time.sleep(3)
    status, _ = dflash_server.get("/health_generate", timeout=120)
    assert status == 200
    log = dflash_server.log_path.read_text(errors="replace")
    assert "memory leak" not in log and "use-after-free" not in log and "double free" not in log


def test_unsupported_request_features_get_a_clear_error(pair, dflash_server):
    ids = chat_ids(pair[2], PROMPTS[0])
    request = {"input_ids": ids, "return_logprob": True, "sampling_params": {"max_new_tokens": 4}}
    with pytest.raises(urllib.error.HTTPError) as refused:
        dflash_server.post("/generate", request)
    assert refused.value.code == 400
    assert "does not support log-probabilities" in refused.value.read().decode()
    status, _ = dflash_server.get("/health_generate", timeout=120)
    assert status == 200
