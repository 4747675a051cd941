"""Start-up behaviour of `--speculative-algorithm DFLASH` with our plugin: clear errors, both workers.

Real `python -m sglang.launch_server` processes on 127.0.0.1 (CPU). A bad flag or a drafter that
cannot serve with the target must stop the server with a message naming the problem.
"""

from __future__ import annotations

import pytest
from sglang_dflash.launch import ServerStartError, launch_server

from sglang_dflash.random_checkpoints import make_random_drafter
from sglang_dflash.targets import load_tokenizer, smollm2_hf_dir

pytestmark = pytest.mark.server

SMOLLM2_SHAPE = dict(hidden_size=576, num_target_layers=30, vocab_size=49152, num_heads=9, num_kv_heads=3, head_dim=64)


def _args(drafter, block):
    return ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", str(drafter),
            "--speculative-num-draft-tokens", str(block)]  # fmt: skip


def _start_fails(drafter, block, tmp_path, message):
    with pytest.raises(ServerStartError) as failure:
        with launch_server(smollm2_hf_dir(), _args(drafter, block), log_dir=tmp_path, timeout=300):
            pass
    assert message in str(failure.value)


def test_block_size_larger_than_trained_is_refused(tmp_path):
    drafter = make_random_drafter(tmp_path / "d", block_size=8, **SMOLLM2_SHAPE)
    _start_fails(drafter, 16, tmp_path, "must be between 1 and the drafter's trained block size 8")


def test_missing_drafter_is_refused(tmp_path):
    _start_fails(tmp_path / "no-such-drafter", 8, tmp_path, "no drafter directory there")


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(hidden_size=512, num_heads=8, num_kv_heads=2), "hidden size 512 != target 576"),
        (dict(num_target_layers=24), "trained on 24 target layers, target has 30"),
        (dict(vocab_size=32000, mask_token_id=5), "vocabulary 32000 != target 49152"),
    ],
)
def test_drafter_that_does_not_fit_the_target_is_refused(tmp_path, change, message):
    drafter = make_random_drafter(tmp_path / "d", block_size=16, **{**SMOLLM2_SHAPE, **change})
    _start_fails(drafter, 8, tmp_path, message)


def test_builtin_worker_gives_the_same_output_as_ours(tmp_path):
    """SGLANG_DFLASH_IMPL=builtin serves with SGLang's own worker (CPU compatibility patches on)."""
    drafter = make_random_drafter(tmp_path / "d", block_size=16, **SMOLLM2_SHAPE)
    tokenizer = load_tokenizer(smollm2_hf_dir())
    prompts = [
        list(tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True)["input_ids"])
        for t in ("Write a quicksort in Python.", "Count from 1 to 10.", "Name three colors.")
    ]
    outputs = {}
    for impl in ("ours", "builtin"):
        env = {"SGLANG_DFLASH_IMPL": impl}
        with launch_server(smollm2_hf_dir(), _args(drafter, 8), env=env, log_dir=tmp_path / impl) as server:
            outputs[impl] = [
                server.post("/generate", {"input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": 24}})[
                    "output_ids"
                ]
                for ids in prompts
            ]
            log = server.log_path.read_text(errors="replace")
        if impl == "ours":
            assert "DFLASH served by our worker" in log
        else:
            assert "DFLASH served by our worker" not in log and "DFLASH draft runner ready" in log
    assert outputs["ours"] == outputs["builtin"]
