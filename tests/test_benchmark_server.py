"""The serving benchmark against real SGLang servers on 127.0.0.1 (CPU): its figures are the servers' own.

A tiny random Qwen3 target with SmolLM2's tokenizer and chat template, served plainly and with DFLASH
(our worker, a random drafter). Nothing here depends on timing: token counts, acceptance, verify
steps and percentiles are recomputed from the per-request records and the servers' answers; the
plain server is stopped in the middle of a run to check the failure accounting.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from sglang_dflash.launch import launch_server, stop_process_group

from sglang_dflash.targets import load_tokenizer, smollm2_hf_dir

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root holds `benchmarks`

from benchmarks import serving  # noqa: E402

pytestmark = pytest.mark.server

MAX_NEW = 12
WARMUP_NEW = 3  # shorter warm-up requests, as make bench sends
BLOCK = 8
TASKS = ["gsm8k", "humaneval"]


@pytest.fixture(scope="module")
def target(checkpoints):
    return checkpoints.target("qwen3", tokenizer_from=smollm2_hf_dir())


@pytest.fixture(scope="module")
def dflash_server(target, checkpoints, tmp_path_factory):
    drafter = checkpoints.drafter(hidden_size=64, num_target_layers=4, vocab_size=49152, block_size=16)
    args = ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", str(drafter),
            "--speculative-num-draft-tokens", str(BLOCK)]  # fmt: skip
    with launch_server(target, args, log_dir=tmp_path_factory.mktemp("dflash")) as server:
        yield server


@pytest.fixture(scope="module")
def plain_server(target, tmp_path_factory):
    with launch_server(target, log_dir=tmp_path_factory.mktemp("plain")) as server:
        yield server


def test_figures_are_the_arithmetic_of_the_servers_answers(target, dflash_server, plain_server, tmp_path):
    code = serving.main([
        "--server", f"ar={plain_server.base_url}", "--server", f"dflash={dflash_server.base_url}",
        "--tasks", ",".join(TASKS), "--concurrency", "1,3", "--num-prompts", "2",
        "--max-new-tokens", str(MAX_NEW), "--warmup-max-new-tokens", str(WARMUP_NEW), "--ignore-eos",
        "--out", str(tmp_path), "--no-progress",
    ])  # fmt: skip
    assert code == 0
    document = json.loads((tmp_path / "results.json").read_text())
    assert document["config"]["tokenizer"] == str(target)  # taken from the server's /model_info
    tokenizer = load_tokenizer(target)
    first_turns = {task: dict(serving.load_first_turns(task)) for task in TASKS}
    runs = {(r["server"], r["task"], r["concurrency"]): r for r in document["runs"]}
    assert sorted(runs) == sorted((s, t, c) for s in ("ar", "dflash") for t in TASKS for c in (1, 3))
    for (server, task, concurrency), run in runs.items():
        metrics, requests = run["metrics"], run["requests"]
        warmup = {"requests": concurrency, "failed": 0, "output_tokens": concurrency * WARMUP_NEW, "errors": []}
        assert run["warmup"] == warmup and run["flush_errors"] == []
        assert metrics["requests"] == metrics["completed"] == len(requests) == max(2, concurrency)
        for record in requests:
            assert record["error_kind"] is None and record["finish_reason"] == "length"
            assert record["completion_tokens"] == MAX_NEW
            # The server counted the prompt we templated: one user turn through the chat template.
            expected = serving.chat_prompt_ids(tokenizer, first_turns[task][record["row_id"]], False)
            assert record["prompt_tokens"] == len(expected)
            assert 0 < record["ttft_s"] <= record["latency_s"]
        assert metrics["output_tokens"] == MAX_NEW * len(requests)
        assert metrics["output_tokens_per_s"] == pytest.approx(metrics["output_tokens"] / metrics["wall_s"])
        for name, values in (("ttft_ms", [1000 * r["ttft_s"] for r in requests]),
                             ("tpot_ms", [1000 * (r["latency_s"] - r["ttft_s"]) / (MAX_NEW - 1) for r in requests]),
                             ("latency_s", [r["latency_s"] for r in requests])):  # fmt: skip
            for q in serving.PERCENTILES:
                assert metrics[name][f"p{q}"] == pytest.approx(float(np.percentile(values, q)))
        if server == "ar":
            assert metrics["accept_length_mean"] is None and metrics["verify_steps"] is None
            continue
        steps = [r["verify_steps"] for r in requests]
        assert all(r["accept_length"] == pytest.approx(MAX_NEW / r["verify_steps"]) for r in requests)
        assert metrics["verify_steps"] == sum(steps)
        assert metrics["accept_length_mean"] == pytest.approx(np.mean([MAX_NEW / s for s in steps]))
        histogram = {int(k): v for k, v in metrics["accept_length_histogram"].items()}
        assert sum(histogram.values()) == metrics["verify_steps"]
        assert all(1 <= length <= BLOCK for length in histogram)
        # Every token but the first (from prefill) was committed by a verify step.
        assert sum(length * n for length, n in histogram.items()) >= metrics["output_tokens"] - len(requests)
    table = (tmp_path / "table.md").read_text()
    assert table.startswith("| Task | Concurrency | AR tok/s | dflash tok/s | dflash / AR | τ dflash |")
    assert "| GSM8K | 1 |" in table and "| HumanEval | 3 |" in table and "Failures" not in table
    assert (tmp_path / "speedup.png").read_bytes()[:4] == b"\x89PNG"


def test_a_server_stopped_mid_run_is_counted_not_averaged(target, plain_server):
    """Runs last in this module: it stops the module's plain server."""
    tokenizer = load_tokenizer(target)
    prompt_sets = [serving.PromptSet(task, tokenizer, enable_thinking=False) for task in ("gsm8k", "mbpp")]
    seen = []

    def stop_after_first_timed_answer(record):
        seen.append(record)
        if len(seen) == 2 + 1:  # the warm-up round (2 clients), then one timed answer
            stop_process_group(plain_server.process)

    runs = serving.benchmark_server(
        "ar", plain_server.base_url, prompt_sets, [2], num_prompts=6,
        sampling=serving.Sampling(max_new_tokens=64, ignore_eos=True), timeout_s=60, progress=False,
        on_record=stop_after_first_timed_answer,
    )  # fmt: skip
    stopped, after = runs
    metrics = stopped["metrics"]
    assert stopped["warmup"]["failed"] == 0
    assert metrics["requests"] == 6 and metrics["completed"] + metrics["failed"] == 6
    assert metrics["completed"] >= 1 and metrics["failed"] >= 3  # at least the requests still queued
    assert set(metrics["errors_by_kind"]) <= {"connection", "incomplete", "aborted"}
    assert sum(metrics["errors_by_kind"].values()) == metrics["failed"] == len(metrics["errors"])
    assert metrics["output_tokens_per_s"] is None and not metrics["complete"]
    assert metrics["output_tokens"] == 64 * metrics["completed"]
    # The next run finds nothing listening: every request refused, the flushes reported.
    assert after["metrics"]["failed"] == after["metrics"]["requests"] == 6
    assert after["metrics"]["errors_by_kind"] == {"connection": 6}
    assert after["warmup"]["failed"] == 2 and len(after["flush_errors"]) == 2
    document = serving.new_document({"tasks": ["gsm8k", "mbpp"], "concurrency": [2], "num_prompts": 6}, "ar", [], "test")
    document["servers"]["ar"] = {"title": "AR"}
    document["runs"] = runs
    table = serving.markdown_table(document)
    assert f"| GSM8K | 2 | ✗ {metrics['failed']}/6 failed |" in table and "| MBPP | 2 | ✗ 6/6 failed |" in table
    assert not serving.document_ok(document)
