"""The serving benchmark's arithmetic, prompts, report and failure accounting, without SGLang.

Failures are provoked against real sockets: a port nobody listens on (refused), and a small
standard-library HTTP server that answers with an HTTP error, hangs, or cuts its stream short.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root holds `benchmarks`

from benchmarks import serving  # noqa: E402
from benchmarks.serving import Prompt, RequestRecord, Sampling  # noqa: E402

SHARED_DATASETS = Path(__file__).resolve().parents[2] / "shared" / "datasets"
ROWS = {"gsm8k": 1319, "math500": 500, "humaneval": 164, "mbpp": 257, "mt-bench": 80}


@pytest.mark.parametrize("task", list(serving.TASKS))
def test_shipped_sets_have_every_row_and_the_documented_first_turn(task):
    rows = serving.load_first_turns(task)
    assert len(rows) == ROWS[task] and len({row_id for row_id, _ in rows}) == len(rows)
    raw = [json.loads(line) for line in (serving.DATA_DIR / f"{task}.jsonl").read_text().splitlines()]
    first = raw[0]["meta"]
    suffix = "\nPlease reason step by step, and put your final answer within \\boxed{}."
    expected = {
        "gsm8k": lambda m: m["question"] + suffix,
        "math500": lambda m: m["problem"] + suffix,
        "humaneval": lambda m: "Write a solution to the following problem and make sure that it passes the tests:\n"
        "```python\n" + m["prompt"] + "\n```",
        "mbpp": lambda m: m["prompt"],
        "mt-bench": None,
    }[task]
    if expected is not None:
        assert rows[0][1] == expected(first)
    else:
        assert len(raw[0]["turns"]) == 2 and rows[0][1] == raw[0]["turns"][0]


@pytest.mark.skipif(not SHARED_DATASETS.is_dir(), reason="no ../shared/datasets checkout to compare with")
@pytest.mark.parametrize("task", list(serving.TASKS))
def test_shipped_sets_are_the_shared_copies(task):
    assert (serving.DATA_DIR / f"{task}.jsonl").read_bytes() == (SHARED_DATASETS / f"{task}.jsonl").read_bytes()


class FakeTokenizer:
    """Records the chat-template call; one id per character."""

    def __init__(self):
        self.calls = []

    def apply_chat_template(self, messages, tokenize, add_generation_prompt, enable_thinking):
        self.calls.append((messages, tokenize, add_generation_prompt, enable_thinking))
        return f"<user>{messages[0]['content']}</user><assistant>"

    def __call__(self, text, add_special_tokens):
        assert add_special_tokens is False
        return {"input_ids": [ord(c) for c in text]}


def test_prompts_wrap_first_turns_in_the_chat_template_warmup_first_then_timed():
    tokenizer = FakeTokenizer()
    prompt_set = serving.PromptSet("mt-bench", tokenizer, enable_thinking=True)
    warmup, timed = prompt_set.for_run(concurrency=2, num_prompts=3)
    ids = [p.row_id for p in warmup + timed]
    assert ids == [prompt_set.rows[i][0] for i in range(5)]
    text = "".join(map(chr, warmup[0].input_ids))
    assert text == f"<user>{prompt_set.rows[0][1]}</user><assistant>"
    assert {call[1:] for call in tokenizer.calls} == {(False, True, True)}
    # At least one timed request per client; 'all' wraps around the set once.
    assert len(prompt_set.for_run(concurrency=8, num_prompts=3)[1]) == 8
    warmup, timed = prompt_set.for_run(concurrency=4, num_prompts=None)
    assert len(timed) == 80 and sorted(p.row_id for p in timed) == sorted(r[0] for r in prompt_set.rows)


@pytest.mark.parametrize("values", [[3.0], [5.0, 1.0], [0.3, 9.0, 2.0, 7.5, 1.25, 4.0, 8.0], list(range(101))])
def test_percentiles_match_numpy(values):
    for q in (0, 50, 90, 99, 100):
        assert serving.percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    assert serving.percentile([], 50) is None


def _record(row, tokens, latency, ttft, verify=None, histogram=None, error=None):
    record = RequestRecord(row, prompt_tokens=10, completion_tokens=tokens, latency_s=latency, ttft_s=ttft)
    if verify:
        record.verify_steps, record.accept_length, record.correct_drafts_histogram = verify, tokens / verify, histogram
    if error:
        record.error_kind, record.error, record.latency_s = error, "boom", None
    return record


def test_summary_arithmetic():
    records = [
        _record("a", 33, 2.0, 0.4, verify=8, histogram=[2, 0, 3, 0, 3]),  # lengths 1x2, 3x3, 5x3: 2+9+15 = 26
        _record("b", 17, 1.0, 0.2, verify=16, histogram=[16]),
        _record("c", 1, 0.5, 0.5, verify=1, histogram=[1]),  # one token: no TPOT
    ]
    metrics = serving.summarize(records, wall_s=2.5)
    assert metrics["requests"] == metrics["completed"] == 3 and metrics["failed"] == 0 and metrics["complete"]
    assert metrics["output_tokens"] == 51 and metrics["prompt_tokens"] == 30
    assert metrics["output_tokens_per_s"] == pytest.approx(51 / 2.5)
    assert metrics["verify_steps"] == 25
    assert metrics["accept_length_mean"] == pytest.approx((33 / 8 + 17 / 16 + 1) / 3)
    assert metrics["accept_length_pooled"] == pytest.approx(51 / 25)
    assert metrics["accept_length_histogram"] == {"1": 19, "3": 3, "5": 3}
    tpots = [(2.0 - 0.4) / 32, (1.0 - 0.2) / 16]
    assert metrics["tpot_ms"]["p50"] == pytest.approx(1000 * float(np.percentile(tpots, 50)))
    assert metrics["ttft_ms"]["p90"] == pytest.approx(1000 * float(np.percentile([0.4, 0.2, 0.5], 90)))
    assert metrics["latency_s"]["p99"] == pytest.approx(float(np.percentile([2.0, 1.0, 0.5], 99)))


def test_a_failed_request_voids_the_throughput_but_is_counted():
    records = [_record("a", 30, 2.0, 0.4), _record("b", 5, 0, 0, error="connection"), _record("c", 0, 0, 0, error="timeout")]
    metrics = serving.summarize(records, wall_s=2.0)
    assert metrics["completed"] == 1 and metrics["failed"] == 2 and not metrics["complete"]
    assert metrics["errors_by_kind"] == {"connection": 1, "timeout": 1}
    assert metrics["output_tokens"] == 30  # the failed request's streamed tokens are not counted
    assert metrics["output_tokens_per_s"] is None
    assert metrics["output_tokens_per_s_completed_only"] == pytest.approx(15.0)
    assert metrics["accept_length_mean"] is None and metrics["verify_steps"] is None


def _run(server, task, concurrency, tokens_per_s, accept=None, failed=0):
    metrics = serving.summarize([], 1.0)
    metrics.update(requests=4, completed=4 - failed, failed=failed, complete=not failed,
                   output_tokens_per_s=None if failed else tokens_per_s, accept_length_mean=accept,
                   errors_by_kind={"connection": failed} if failed else {},
                   errors=["x: connection: refused"] if failed else [])  # fmt: skip
    return {"server": server, "task": task, "concurrency": concurrency, "metrics": metrics,
            "warmup": {"requests": concurrency, "failed": 0, "errors": []}, "flush_errors": [], "requests": []}  # fmt: skip


def _document(tmp_path=None):
    config = {"tasks": ["gsm8k", "mt-bench"], "concurrency": [1, 8], "num_prompts": 4, "enable_thinking": False,
              "sampling": {"max_new_tokens": 16, "temperature": 0.0, "top_p": 1.0, "top_k": -1, "ignore_eos": False}}
    document = serving.new_document(config, "ar", [("ours", "ar"), ("builtin", "ar"), ("ours", "builtin")], command="test")
    document["servers"] = {"ar": {"title": "AR"}, "ours": {"title": "DFLASH (ours)", "speculative": True},
                           "builtin": {"title": "DFLASH (builtin)", "speculative": True, "error": "did not start: ValueError: mask"}}
    document["runs"] = [
        _run("ar", "gsm8k", 1, 10.0), _run("ours", "gsm8k", 1, 25.0, accept=3.5),
        _run("ar", "gsm8k", 8, 40.0), _run("ours", "gsm8k", 8, 60.0, accept=3.25),
        _run("ar", "mt-bench", 1, 10.0), _run("ours", "mt-bench", 1, 12.0, accept=1.5),
        _run("ar", "mt-bench", 8, 40.0), _run("ours", "mt-bench", 8, 0.0, accept=2.0, failed=2),
    ]  # fmt: skip
    return document


def test_markdown_table_is_laid_out_like_the_model_card():
    table = serving.markdown_table(_document())
    lines = table.splitlines()
    assert lines[0] == ("| Task | Concurrency | AR tok/s | DFLASH (ours) tok/s | DFLASH (builtin) tok/s | "
                        "DFLASH (ours) / AR | DFLASH (builtin) / AR | DFLASH (ours) / DFLASH (builtin) | "
                        "τ DFLASH (ours) | τ DFLASH (builtin) |")  # fmt: skip
    assert lines[2] == "| GSM8K | 1 | 10.0 | 25.0 | ✗ server failed | 2.50× | – | – | 3.50 | – |"
    assert lines[3] == "| GSM8K | 8 | 40.0 | 60.0 | ✗ server failed | 1.50× | – | – | 3.25 | – |"
    assert lines[4].startswith("| MT-Bench | 1 | 10.0 | 12.0 |")
    # A run with failures shows them instead of a figure, and no ratio or τ.
    assert lines[5] == "| MT-Bench | 8 | 40.0 | ✗ 2/4 failed | ✗ server failed | – | – | – | – | – |"
    assert "DFLASH (builtin): server failed: did not start: ValueError: mask" in table
    assert "DFLASH (ours) MT-Bench c=8: 2 of 4 requests failed (2 connection)" in table


def test_report_writes_json_markdown_and_png_and_merges(tmp_path):
    document = _document()
    paths = serving.write_report(document, tmp_path / "out")
    assert json.loads(paths["json"].read_text())["runs"] == document["runs"]
    assert paths["markdown"].read_text() == serving.markdown_table(document)
    assert paths["plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not serving.document_ok(document)
    # Separate runs (as on a GPU with one server at a time) merge into one table.
    ar = {**document, "servers": {"ar": document["servers"]["ar"]}, "runs": document["runs"][0::2]}
    ours = {**document, "servers": {"ours": document["servers"]["ours"]}, "runs": document["runs"][1::2]}
    merged = serving.merge_documents([ar, ours])
    assert merged["baseline"] == "ar" and merged["ratios"] == [["ours", "ar"]]
    assert "| GSM8K | 1 | 10.0 | 25.0 | 2.50× | 3.50 |" in serving.markdown_table(merged)
    (tmp_path / "ar.json").write_text(json.dumps(ar))
    (tmp_path / "ours.json").write_text(json.dumps(ours))
    code = serving.main(["report", str(tmp_path / "ar.json"), str(tmp_path / "ours.json"), "--out", str(tmp_path / "m")])
    assert code == 1  # a run of the merged document had failures
    assert (tmp_path / "m" / "table.md").read_text() == serving.markdown_table(merged)


class StubHandler(BaseHTTPRequestHandler):
    """/generate answers according to the server's `mode`; /flush_cache and /model_info answer 200."""

    def log_message(self, *args):
        pass

    def do_GET(self):
        self._send(200, json.dumps({"model_path": "stub", "tokenizer_path": "stub"}).encode())

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        mode = self.server.mode
        if self.path == "/flush_cache":
            return self._send(200, b"Cache flushed.\n")
        if mode == "http-error":
            return self._send(503, b'{"error": "overloaded"}')
        if mode == "hang":
            time.sleep(3)
            return self._send(200, b"")
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        meta = {"completion_tokens": 1, "prompt_tokens": 3, "finish_reason": None}
        self.wfile.write(b"data: " + json.dumps({"text": "a", "meta_info": meta}).encode() + b"\n\n")
        if mode == "stream-error":
            self.wfile.write(b'data: {"error": {"message": "out of memory"}}\n\n')
        elif mode == "ok":
            meta = {**meta, "completion_tokens": 2, "finish_reason": {"type": "length", "length": 2},
                    "spec_verify_ct": 1, "spec_accept_length": 2.0, "spec_correct_drafts_histogram": [0, 1]}  # fmt: skip
            self.wfile.write(b"data: " + json.dumps({"text": "ab", "meta_info": meta}).encode() + b"\n\n")
            self.wfile.write(b"data: [DONE]\n\n")
        # mode "cut": the stream ends without [DONE]

    def _send(self, status, body):
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def stub():
    server = ThreadingHTTPServer(("127.0.0.1", 0), StubHandler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


PROMPT = Prompt("row/0", (1, 2, 3))


@pytest.mark.parametrize(
    "mode, kind, message",
    [("http-error", "http", "HTTP 503"), ("stream-error", "server", "out of memory"),
     ("cut", "incomplete", "before its final [DONE]"), ("hang", "timeout", "within 0.5 s")],
)  # fmt: skip
def test_each_kind_of_server_failure_is_reported_per_request(stub, mode, kind, message):
    stub.mode = mode
    record = serving.send_request(f"http://127.0.0.1:{stub.server_port}", PROMPT, Sampling(max_new_tokens=2), 0.5)
    assert not record.ok and record.error_kind == kind and message in record.error


def test_a_good_stream_is_read_to_the_end(stub):
    stub.mode = "ok"
    record = serving.send_request(f"http://127.0.0.1:{stub.server_port}", PROMPT, Sampling(max_new_tokens=2), 5)
    assert record.ok and record.completion_tokens == 2 and record.finish_reason == "length"
    assert record.verify_steps == 1 and record.accept_length == 2.0 and record.correct_drafts_histogram == [0, 1]
    assert 0 < record.ttft_s <= record.latency_s and record.prompt_tokens == 3


def test_refused_connections_are_counted_and_the_run_has_no_figure(tmp_path):
    import socket

    with socket.socket() as sock:  # a port that was free a moment ago and has no listener
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    records, wall_s = serving.run_closed_loop(url, [PROMPT] * 5, 2, Sampling(), 5)
    metrics = serving.summarize(records, wall_s)
    assert metrics["failed"] == 5 and metrics["errors_by_kind"] == {"connection": 5}
    assert metrics["output_tokens_per_s"] is None
    assert all("connection refused" in r.error for r in records)
    # The command line reports the unreachable server and exits non-zero, still writing its report.
    code = serving.main(["--server", f"dflash={url}", "--tasks", "gsm8k", "--concurrency", "1",
                         "--num-prompts", "1", "--out", str(tmp_path), "--no-progress"])  # fmt: skip
    document = json.loads((tmp_path / "results.json").read_text())
    assert code == 1 and "model_info failed" in document["servers"]["dflash"]["error"]
    assert "| GSM8K | 1 | ✗ server failed |" in (tmp_path / "table.md").read_text()
