"""The serving benchmark: generated tokens per second of SGLang servers on the five DFlash sets.

    python -m benchmarks.serving --server ar=http://127.0.0.1:30001 --server dflash=http://127.0.0.1:30000
    python -m benchmarks.serving report A.json B.json --out DIR      # merge runs made separately

For every server, task and concurrency C: flush the radix cache, send one warm-up round (one request
per client), flush again, then run a closed loop of C clients over the timed prompts (each client
sends its next request as soon as its previous one has finished). Requests go to SGLang's native
/generate endpoint, streamed, as token ids: the first user turn of each row wrapped in the target's
chat template (`add_generation_prompt`, `enable_thinking` as a flag), exactly as the reference
harness formats it. Per run it records output tokens/s (completed output tokens over the wall time
of the timed loop), the mean acceptance length (mean of SGLang's per-request `spec_accept_length`),
verify steps, TTFT / TPOT / latency percentiles and the acceptance-length histogram.

A request that fails (connection refused or dropped, HTTP error, error inside the stream, abort,
timeout) is recorded with its reason and counted; a run with any failed request has no throughput
figure (the table shows the failure instead), so a failure can never pass for a slower server.

Output in --out: results.json (everything, per request too), table.md (the model card's layout:
tokens/s per server, the ratios and the acceptance length per task and concurrency) and speedup.png
(each ratio against concurrency). The table is also printed.
"""

from __future__ import annotations

import argparse
import datetime
import http.client
import json
import math
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
import urllib.parse
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

SCHEMA = "sglang-dflash-benchmark/1"
DATA_DIR = Path(__file__).resolve().parent / "data"
RESULTS_DIR = Path(__file__).resolve().parent / "results"
# The model card's order and names.
TASKS = {"math500": "Math500", "gsm8k": "GSM8K", "humaneval": "HumanEval", "mbpp": "MBPP", "mt-bench": "MT-Bench"}
PERCENTILES = (50, 90, 99)
DEFAULT_CONCURRENCY = (1, 8, 32)
MAX_ERRORS_KEPT = 20  # per run, in results.json; the counts are always complete


# --------------------------------------------------------------------------------------------
# Prompts


def load_first_turns(task: str, data_dir: Path = DATA_DIR) -> list[tuple[str, str]]:
    """(row id, first user turn) of every row of a set, in file order (server mode sends turn 0 only)."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; choose from {', '.join(TASKS)}")
    rows = []
    with open(data_dir / f"{task}.jsonl", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                rows.append((row["id"], row["turns"][0]))
    return rows


def chat_prompt_ids(tokenizer, user_text: str, enable_thinking: bool) -> list[int]:
    """One user message through the chat template, tokenised as the chat endpoint would (no extra BOS)."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": user_text}],
        tokenize=False,
        add_generation_prompt=True,
        enable_thinking=enable_thinking,
    )
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


@dataclass(frozen=True)
class Prompt:
    row_id: str
    input_ids: tuple[int, ...]


class PromptSet:
    """The rows of one task, templated and tokenised on first use (shared by every run and server)."""

    def __init__(self, task: str, tokenizer, enable_thinking: bool, data_dir: Path = DATA_DIR):
        self.task = task
        self.rows = load_first_turns(task, data_dir)
        self._tokenizer = tokenizer
        self._enable_thinking = enable_thinking
        self._tokenised: dict[int, Prompt] = {}

    def prompt(self, index: int) -> Prompt:
        index %= len(self.rows)
        if index not in self._tokenised:
            row_id, text = self.rows[index]
            self._tokenised[index] = Prompt(row_id, tuple(chat_prompt_ids(self._tokenizer, text, self._enable_thinking)))
        return self._tokenised[index]

    def for_run(self, concurrency: int, num_prompts: int | None) -> tuple[list[Prompt], list[Prompt]]:
        """(warm-up, timed): rows 0..C-1 warm up, the next ones are timed, wrapping around the set.

        `num_prompts` None means the whole set. The timed count is at least C, so that every client
        sends at least one timed request.
        """
        timed = len(self.rows) if num_prompts is None else num_prompts
        timed = max(timed, concurrency)
        warmup = [self.prompt(i) for i in range(concurrency)]
        return warmup, [self.prompt(concurrency + i) for i in range(timed)]


# --------------------------------------------------------------------------------------------
# One request


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1  # SGLang's "no top-k"
    max_new_tokens: int = 2048
    ignore_eos: bool = False

    def payload(self) -> dict:
        params = {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                  "max_new_tokens": self.max_new_tokens}  # fmt: skip
        if self.ignore_eos:
            params["ignore_eos"] = True
        return params


@dataclass
class RequestRecord:
    row_id: str
    prompt_tokens: int
    completion_tokens: int = 0  # on a failed request: tokens streamed before the failure
    latency_s: float | None = None
    ttft_s: float | None = None
    verify_steps: int | None = None  # SGLang's spec_verify_ct: target verify passes for this request
    accept_length: float | None = None  # SGLang's spec_accept_length = completion_tokens / verify steps
    correct_drafts_histogram: list[int] | None = None  # [k] = verify steps that kept k drafts
    finish_reason: str | None = None
    error_kind: str | None = None  # connection | http | timeout | incomplete | server | aborted
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error_kind is None

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first one."""
        if self.latency_s is None or self.ttft_s is None or self.completion_tokens < 2:
            return None
        return (self.latency_s - self.ttft_s) / (self.completion_tokens - 1)


class RequestFailed(Exception):
    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind
        self.message = message


def _split_url(base_url: str) -> tuple[str, int, str]:
    parts = urllib.parse.urlsplit(base_url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"expected an http://host:port URL, got {base_url!r}")
    return parts.hostname, parts.port or 80, parts.path.rstrip("/")


def send_request(base_url: str, prompt: Prompt, sampling: Sampling, timeout_s: float) -> RequestRecord:
    """One streamed /generate request, timed; never raises: a failure is written into the record."""
    record = RequestRecord(prompt.row_id, len(prompt.input_ids))
    host, port, prefix = _split_url(base_url)
    body = json.dumps({"input_ids": list(prompt.input_ids), "sampling_params": sampling.payload(), "stream": True})
    connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
    started = time.perf_counter()
    deadline = started + timeout_s
    try:
        connection.request("POST", prefix + "/generate", body=body, headers={"Content-Type": "application/json"})
        sock = connection.sock  # kept: a response that closes the connection takes it off `connection`
        response = connection.getresponse()
        if response.status != 200:
            detail = response.read(400).decode(errors="replace").strip()
            raise RequestFailed("http", f"HTTP {response.status} {response.reason}: {detail}")
        meta, done = None, False
        while True:
            left = deadline - time.perf_counter()
            if left <= 0:
                raise RequestFailed("timeout", f"no answer within {timeout_s:g} s")
            sock.settimeout(left)  # the deadline bounds the whole request, not each read
            line = response.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[len(b"data:"):].strip()
            if data == b"[DONE]":
                done = True
                break
            chunk = json.loads(data)
            if "error" in chunk:
                error = chunk["error"]
                raise RequestFailed("server", str(error.get("message", error) if isinstance(error, dict) else error))
            meta = chunk.get("meta_info") or meta
            if meta:
                record.completion_tokens = int(meta.get("completion_tokens", 0))
                if record.ttft_s is None and record.completion_tokens > 0:
                    record.ttft_s = time.perf_counter() - started
        if not done or meta is None:
            raise RequestFailed("incomplete", "the stream ended before its final [DONE] message")
        record.latency_s = time.perf_counter() - started
        _read_final_meta(record, meta)
        if record.finish_reason == "abort":
            message = meta["finish_reason"].get("message") if isinstance(meta.get("finish_reason"), dict) else None
            raise RequestFailed("aborted", f"the server aborted the request: {message or 'no reason given'}")
    except RequestFailed as failure:
        record.error_kind, record.error = failure.kind, failure.message
    except TimeoutError:  # socket.timeout
        record.error_kind, record.error = "timeout", f"no answer within {timeout_s:g} s"
    except ConnectionRefusedError:
        record.error_kind, record.error = "connection", f"connection refused by {host}:{port}"
    except (OSError, http.client.HTTPException) as error:
        record.error_kind, record.error = "connection", f"{type(error).__name__}: {error}"
    except (ValueError, KeyError, TypeError) as error:  # malformed JSON or meta_info
        record.error_kind, record.error = "incomplete", f"unreadable answer: {type(error).__name__}: {error}"
    finally:
        connection.close()
    return record


def _read_final_meta(record: RequestRecord, meta: dict) -> None:
    record.completion_tokens = int(meta.get("completion_tokens", record.completion_tokens))
    record.prompt_tokens = int(meta.get("prompt_tokens", record.prompt_tokens))
    reason = meta.get("finish_reason")
    record.finish_reason = reason.get("type") if isinstance(reason, dict) else reason
    if meta.get("spec_verify_ct"):
        record.verify_steps = int(meta["spec_verify_ct"])
        record.accept_length = float(meta["spec_accept_length"])
        histogram = meta.get("spec_correct_drafts_histogram")
        record.correct_drafts_histogram = [int(c) for c in histogram] if histogram else None


def flush_cache(base_url: str, attempts: int = 20, timeout_s: float = 60.0) -> str | None:
    """POST /flush_cache; None when flushed, else why not (SGLang refuses while requests are running)."""
    host, port, prefix = _split_url(base_url)
    message = "not attempted"
    for _ in range(attempts):
        connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
        try:
            connection.request("POST", prefix + "/flush_cache")
            response = connection.getresponse()
            text = response.read(400).decode(errors="replace").strip()
            if response.status == 200:
                return None
            message = f"HTTP {response.status}: {text}"
        except (OSError, http.client.HTTPException) as error:
            return f"{type(error).__name__}: {error}"
        finally:
            connection.close()
        time.sleep(0.5)
    return message


def get_json(base_url: str, path: str, timeout_s: float = 60.0) -> dict:
    host, port, prefix = _split_url(base_url)
    connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        connection.request("GET", prefix + path)
        response = connection.getresponse()
        body = response.read()
        if response.status != 200:
            raise RequestFailed("http", f"GET {path}: HTTP {response.status}")
        return json.loads(body)
    finally:
        connection.close()


# --------------------------------------------------------------------------------------------
# A run: closed loop of C clients


def run_closed_loop(
    base_url: str,
    prompts: Sequence[Prompt],
    concurrency: int,
    sampling: Sampling,
    timeout_s: float,
    on_record: Callable[[RequestRecord], None] | None = None,
) -> tuple[list[RequestRecord], float]:
    """(records in prompt order, wall seconds from the first send to the last answer)."""
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        started = time.perf_counter()
        jobs = [pool.submit(send_request, base_url, prompt, sampling, timeout_s) for prompt in prompts]
        for job in as_completed(jobs):
            if on_record is not None:
                on_record(job.result())
        wall_s = time.perf_counter() - started
    return [job.result() for job in jobs], wall_s


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile, linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _percentiles(values: Sequence[float], scale: float = 1.0) -> dict[str, float | None]:
    return {f"p{q}": (None if (v := percentile(values, q)) is None else v * scale) for q in PERCENTILES}


def summarize(records: Sequence[RequestRecord], wall_s: float) -> dict:
    """The figures of one run. Only completed requests enter them; any failure voids the throughput."""
    completed = [r for r in records if r.ok]
    failed = [r for r in records if not r.ok]
    output_tokens = sum(r.completion_tokens for r in completed)
    speculative = [r for r in completed if r.verify_steps]
    histogram: Counter[int] = Counter()
    for r in speculative:
        for kept, steps in enumerate(r.correct_drafts_histogram or ()):
            if steps:
                histogram[kept + 1] += steps  # acceptance length = drafts kept + the target's own token
    verify_steps = sum(r.verify_steps for r in speculative)
    return {
        "requests": len(records),
        "completed": len(completed),
        "failed": len(failed),
        "complete": not failed and bool(records),
        "errors_by_kind": dict(Counter(r.error_kind for r in failed)),
        "errors": [f"{r.row_id}: {r.error_kind}: {r.error}" for r in failed[:MAX_ERRORS_KEPT]],
        "wall_s": wall_s,
        "prompt_tokens": sum(r.prompt_tokens for r in completed),
        "output_tokens": output_tokens,
        "output_tokens_per_s": output_tokens / wall_s if not failed and records and wall_s > 0 else None,
        # Diagnostic only (never tabulated): a failed run's completed requests over the whole wall time.
        "output_tokens_per_s_completed_only": output_tokens / wall_s if wall_s > 0 else None,
        "accept_length_mean": sum(r.accept_length for r in speculative) / len(speculative) if speculative else None,
        "accept_length_pooled": sum(r.completion_tokens for r in speculative) / verify_steps if verify_steps else None,
        "verify_steps": verify_steps if speculative else None,
        "accept_length_histogram": {str(length): histogram[length] for length in sorted(histogram)},
        "ttft_ms": _percentiles([r.ttft_s for r in completed if r.ttft_s is not None], 1000.0),
        "tpot_ms": _percentiles([t for r in completed if (t := r.tpot_s) is not None], 1000.0),
        "latency_s": _percentiles([r.latency_s for r in completed if r.latency_s is not None]),
    }


# --------------------------------------------------------------------------------------------
# A server: every task and concurrency


def _progress_bar(total: int, description: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc=description, unit="req", disable=not enabled, leave=True, dynamic_ncols=True)


def benchmark_server(
    label: str,
    base_url: str,
    prompt_sets: Sequence[PromptSet],
    concurrencies: Sequence[int],
    num_prompts: int | None,
    sampling: Sampling,
    timeout_s: float,
    progress: bool = True,
    on_record: Callable[[RequestRecord], None] | None = None,
    warmup_max_new_tokens: int | None = None,
) -> list[dict]:
    """Every (task, concurrency) run against one server, in that order.

    The warm-up round sends `warmup_max_new_tokens` (default: the timed runs' own) per request.
    """
    warmup_sampling = replace(sampling, max_new_tokens=warmup_max_new_tokens or sampling.max_new_tokens)
    runs = []
    for prompt_set in prompt_sets:
        for concurrency in concurrencies:
            warmup, timed = prompt_set.for_run(concurrency, num_prompts)
            flush_errors = []
            bar = _progress_bar(len(warmup) + len(timed), f"{label} {prompt_set.task} c={concurrency} warm-up", progress)
            failures = Counter()

            def count(record: RequestRecord) -> None:
                bar.update(1)
                if not record.ok:
                    failures[record.error_kind] += 1
                    bar.set_postfix(failed=sum(failures.values()))
                if on_record is not None:
                    on_record(record)

            with bar:
                if (error := flush_cache(base_url)) is not None:
                    flush_errors.append(f"before warm-up: {error}")
                warm_records, _ = run_closed_loop(base_url, warmup, concurrency, warmup_sampling, timeout_s, count)
                if (error := flush_cache(base_url)) is not None:
                    flush_errors.append(f"before the timed run: {error}")
                bar.set_description(f"{label} {prompt_set.task} c={concurrency}")
                records, wall_s = run_closed_loop(base_url, timed, concurrency, sampling, timeout_s, count)
            warm_failed = [r for r in warm_records if not r.ok]
            runs.append({
                "server": label,
                "task": prompt_set.task,
                "concurrency": concurrency,
                "warmup": {"requests": len(warm_records), "failed": len(warm_failed),
                           "output_tokens": sum(r.completion_tokens for r in warm_records),
                           "errors": [f"{r.row_id}: {r.error_kind}: {r.error}" for r in warm_failed[:MAX_ERRORS_KEPT]]},
                "flush_errors": flush_errors,
                "metrics": summarize(records, wall_s),
                "requests": [asdict(r) for r in records],
            })  # fmt: skip
    return runs


def server_info(base_url: str) -> dict:
    """What the server says it serves (/model_info), or raises if it does not answer."""
    info = get_json(base_url, "/model_info")
    return {key: info.get(key) for key in ("model_path", "tokenizer_path", "served_model_name", "model_type", "architectures")}


# --------------------------------------------------------------------------------------------
# The result document


def machine_description() -> dict:
    """The client machine (for loopback servers, also the server's)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    memory_gb = None
    try:
        with open("/proc/meminfo") as f:
            memory_gb = round(int(next(line for line in f if line.startswith("MemTotal")).split()[1]) / 2**20, 1)
    except (OSError, StopIteration, ValueError):
        pass
    gpus = []
    if shutil.which("nvidia-smi"):
        try:
            listing = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                     capture_output=True, text=True, timeout=30)  # fmt: skip
            gpus = [line.strip() for line in listing.stdout.splitlines() if line.strip()]
        except (OSError, subprocess.SubprocessError):
            pass
    return {
        "host": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "memory_gb": memory_gb,
        "gpus": gpus,
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def new_document(config: dict, baseline: str | None, ratios: Sequence[tuple[str, str]], command: str | None = None) -> dict:
    return {
        "schema": SCHEMA,
        "created": datetime.datetime.now(datetime.timezone.utc).astimezone().isoformat(timespec="seconds"),
        "machine": machine_description(),
        "command": command if command is not None else shlex.join([Path(sys.executable).name, *sys.argv]),
        "config": config,
        "baseline": baseline,
        "ratios": [list(r) for r in ratios],
        "servers": {},
        "runs": [],
    }


def default_ratios(labels: Sequence[str], baseline: str | None) -> list[tuple[str, str]]:
    return [(label, baseline) for label in labels if baseline and label != baseline and baseline in labels]


def merge_documents(documents: Sequence[dict], baseline: str | None = None, ratios: Sequence[tuple[str, str]] = ()) -> dict:
    """One document from several (e.g. the AR and DFLASH servers measured one after the other)."""
    if not documents:
        raise ValueError("nothing to merge")
    merged = json.loads(json.dumps(documents[0]))
    merged["sources"] = [d.get("created") for d in documents]
    for document in documents[1:]:
        for label, server in document["servers"].items():
            if label in merged["servers"]:
                raise ValueError(f"server label {label!r} appears in two documents; relabel one")
            merged["servers"][label] = server
        merged["runs"].extend(document["runs"])
        if document["config"].get("sampling") != merged["config"].get("sampling"):
            merged.setdefault("notes", []).append(f"sampling differs in the run of {document.get('created')}")
    labels = list(merged["servers"])
    merged["baseline"] = baseline or merged.get("baseline") or ("ar" if "ar" in labels else None)
    merged["ratios"] = [list(r) for r in (ratios or default_ratios(labels, merged["baseline"]))]
    return merged


# --------------------------------------------------------------------------------------------
# The table and the plot


def _run_index(document: dict) -> dict[tuple[str, str, int], dict]:
    return {(run["server"], run["task"], run["concurrency"]): run for run in document["runs"]}


def _title(document: dict, label: str) -> str:
    return document["servers"].get(label, {}).get("title") or label


def _throughput(run: dict | None) -> float | None:
    return None if run is None else run["metrics"]["output_tokens_per_s"]


def _throughput_cell(document: dict, label: str, run: dict | None) -> str:
    if document["servers"].get(label, {}).get("error"):
        return "✗ server failed"
    if run is None:
        return "–"
    metrics = run["metrics"]
    if metrics["output_tokens_per_s"] is None:
        return f"✗ {metrics['failed']}/{metrics['requests']} failed"
    return f"{metrics['output_tokens_per_s']:.1f}"


def _tasks_and_concurrencies(document: dict) -> tuple[list[str], list[int]]:
    """The configured ones (a server that failed still gets its rows), then any other that was run."""
    tasks = list(document["config"].get("tasks", ()))
    tasks += [t for t in TASKS if t not in tasks and any(run["task"] == t for run in document["runs"])]
    concurrencies = set(document["config"].get("concurrency", ())) | {run["concurrency"] for run in document["runs"]}
    return tasks, sorted(concurrencies)


def markdown_table(document: dict) -> str:
    """Task x concurrency rows; tokens/s per server, each ratio, τ (mean acceptance length) per server."""
    labels = list(document["servers"])
    ratios = [tuple(r) for r in document.get("ratios", ())]
    runs = _run_index(document)
    speculative = [l for l in labels if any(r["metrics"]["accept_length_mean"] is not None
                                            for r in document["runs"] if r["server"] == l)]  # fmt: skip
    speculative += [l for l in labels if l not in speculative and l != document.get("baseline")
                    and document["servers"][l].get("speculative")]  # fmt: skip
    header = ["Task", "Concurrency", *(f"{_title(document, l)} tok/s" for l in labels),
              *(f"{_title(document, a)} / {_title(document, b)}" for a, b in ratios),
              *(f"τ {_title(document, l)}" for l in speculative)]  # fmt: skip
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * 2 + ["---:"] * (len(header) - 2)) + "|"]
    tasks, concurrencies = _tasks_and_concurrencies(document)
    for task in tasks:
        for concurrency in concurrencies:
            cells = [TASKS.get(task, task), str(concurrency)]
            cells += [_throughput_cell(document, l, runs.get((l, task, concurrency))) for l in labels]
            for a, b in ratios:
                num, den = _throughput(runs.get((a, task, concurrency))), _throughput(runs.get((b, task, concurrency)))
                cells.append(f"{num / den:.2f}×" if num is not None and den else "–")
            for label in speculative:
                run = runs.get((label, task, concurrency))
                accept = run["metrics"]["accept_length_mean"] if run and run["metrics"]["complete"] else None
                cells.append(f"{accept:.2f}" if accept is not None else "–")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n" + _table_notes(document)


def _warmup_note(config: dict) -> str:
    warmup, timed = config.get("warmup_max_new_tokens"), config.get("sampling", {}).get("max_new_tokens")
    return f" of {warmup}-token requests" if warmup and warmup != timed else ""


def _table_notes(document: dict) -> str:
    config = document["config"]
    sampling = config.get("sampling", {})
    prompts = "the whole set" if config.get("num_prompts") is None else f"{config['num_prompts']} prompts"
    notes = [
        "",
        f"tok/s: generated tokens per second over the timed closed loop ({prompts} per run, at least one per "
        f"client, after a warm-up round{_warmup_note(config)}; radix cache flushed before each); τ: mean acceptance length "
        f"(SGLang's spec_accept_length, mean over requests). max_new_tokens {sampling.get('max_new_tokens')}, "
        f"temperature {sampling.get('temperature')}, top_p {sampling.get('top_p')}, top_k {sampling.get('top_k')}"
        f"{', ignore_eos' if sampling.get('ignore_eos') else ''}, enable_thinking {config.get('enable_thinking')}.",
    ]
    problems = []
    for label, server in document["servers"].items():
        if server.get("error"):
            problems.append(f"- {_title(document, label)}: server failed: {server['error']}")
    for run in document["runs"]:
        metrics = run["metrics"]
        where = f"{_title(document, run['server'])} {TASKS.get(run['task'], run['task'])} c={run['concurrency']}"
        if metrics["failed"]:
            kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(metrics["errors_by_kind"].items()))
            first = metrics["errors"][0] if metrics["errors"] else ""
            problems.append(f"- {where}: {metrics['failed']} of {metrics['requests']} requests failed ({kinds}); first: {first}")
        if run["warmup"]["failed"]:
            problems.append(f"- {where}: {run['warmup']['failed']} warm-up requests failed")
        for error in run.get("flush_errors", ()):
            problems.append(f"- {where}: cache not flushed {error}")
    if problems:
        notes += ["", "Failures:", *problems]
    return "\n".join(notes) + "\n"


def plot_speedup(document: dict, path: Path) -> Path:
    """Each ratio (a server against another) against concurrency, one line per task."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = _run_index(document)
    tasks, concurrencies = _tasks_and_concurrencies(document)
    ratios = [tuple(r) for r in document.get("ratios", ())]
    figure, axes = plt.subplots(1, max(len(ratios), 1), figsize=(5.5 * max(len(ratios), 1), 4.2), squeeze=False)
    for axis, ratio in zip(axes[0], ratios or [None]):
        if ratio is None:
            axis.text(0.5, 0.5, "no ratio to plot", ha="center", va="center", transform=axis.transAxes)
            continue
        a, b = ratio
        drawn = False
        for task in tasks:
            points = []
            for c in concurrencies:
                num, den = _throughput(runs.get((a, task, c))), _throughput(runs.get((b, task, c)))
                if num is not None and den:
                    points.append((c, num / den))
            if points:
                axis.plot(*zip(*points), marker="o", label=TASKS.get(task, task))
                drawn = True
        axis.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
        axis.set_xscale("log", base=2)
        axis.set_xticks(concurrencies or [1])
        axis.set_xticklabels([str(c) for c in concurrencies] or ["1"])
        axis.set_xlabel("concurrency")
        axis.set_ylabel(f"{_title(document, a)} / {_title(document, b)} (tok/s)")
        axis.set_title(f"{_title(document, a)} vs {_title(document, b)}")
        if drawn:
            axis.legend(fontsize=8)
        else:
            axis.text(0.5, 0.5, "no complete pair of runs", ha="center", va="center", transform=axis.transAxes)
    figure.suptitle(f"speedup against concurrency ({document.get('created', '')})", fontsize=9)
    figure.tight_layout()
    path = Path(path)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def write_report(document: dict, out_dir: Path) -> dict[str, Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "results.json", "markdown": out_dir / "table.md", "plot": out_dir / "speedup.png"}
    paths["json"].write_text(json.dumps(document, indent=1) + "\n")
    paths["markdown"].write_text(markdown_table(document))
    plot_speedup(document, paths["plot"])
    return paths


def document_ok(document: dict) -> bool:
    """No server failed and every run completed every request."""
    return not any(s.get("error") for s in document["servers"].values()) and all(
        run["metrics"]["complete"] for run in document["runs"]
    )


# --------------------------------------------------------------------------------------------
# Command line


def parse_concurrency(text: str) -> list[int]:
    values = [int(v) for v in text.split(",") if v.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("a comma-separated list of positive integers, e.g. 1,8,32")
    return values


def parse_tasks(text: str) -> list[str]:
    tasks = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in tasks if t not in TASKS]
    if unknown or not tasks:
        raise argparse.ArgumentTypeError(f"unknown task(s) {unknown}; choose from {','.join(TASKS)}")
    return tasks


def parse_num_prompts(text: str) -> int | None:
    if text == "all":
        return None
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("a positive integer or 'all'")
    return value


def parse_ratio(text: str) -> tuple[str, str]:
    a, sep, b = text.partition("/")
    if not sep or not a or not b:
        raise argparse.ArgumentTypeError("LABEL/LABEL, e.g. dflash/ar")
    return a, b


def add_workload_arguments(parser: argparse.ArgumentParser, num_prompts: str = "128", max_new_tokens: int = 2048,
                           timeout_s: float = 3600.0, warmup_max_new_tokens: int | None = None) -> None:  # fmt: skip
    """The flags shared by this harness and `benchmarks.compare`."""
    parser.add_argument("--tasks", type=parse_tasks, default=list(TASKS), help=f"comma-separated subset of {','.join(TASKS)}")
    parser.add_argument("--concurrency", type=parse_concurrency, default=list(DEFAULT_CONCURRENCY),
                        help="comma-separated client counts (default 1,8,32)")  # fmt: skip
    parser.add_argument("--num-prompts", type=parse_num_prompts, default=parse_num_prompts(num_prompts),
                        help=f"timed requests per run, or 'all' for the whole set (default {num_prompts}); at least "
                             "the concurrency")  # fmt: skip
    parser.add_argument("--max-new-tokens", type=int, default=max_new_tokens)
    parser.add_argument("--warmup-max-new-tokens", type=int, default=warmup_max_new_tokens,
                        help="max new tokens of each warm-up request (default: --max-new-tokens)")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=-1, help="-1: no top-k (the reference passes 1, the same at temperature 0)")
    parser.add_argument("--ignore-eos", action="store_true", help="always generate --max-new-tokens tokens")
    parser.add_argument("--enable-thinking", action="store_true", help="passed to the chat template")
    parser.add_argument("--timeout-s", type=float, default=timeout_s, help="per request")
    parser.add_argument("--out", type=Path, default=None, help="output directory (default benchmarks/results/<time>)")
    parser.add_argument("--no-progress", action="store_true")


def sampling_from(args) -> Sampling:
    return Sampling(args.temperature, args.top_p, args.top_k, args.max_new_tokens, args.ignore_eos)


def workload_config(args, tokenizer: str | None) -> dict:
    return {
        "tasks": list(args.tasks),
        "concurrency": list(args.concurrency),
        "num_prompts": args.num_prompts,
        "sampling": asdict(sampling_from(args)),
        "warmup_max_new_tokens": args.warmup_max_new_tokens or args.max_new_tokens,
        "enable_thinking": args.enable_thinking,
        "timeout_s": args.timeout_s,
        "tokenizer": tokenizer,
    }


def default_out_dir(prefix: str = "") -> Path:
    return RESULTS_DIR / (prefix + datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


class Workload:
    """Tokenisers and prompt sets, made once and shared by every server measured with them."""

    def __init__(self, tasks: Sequence[str], enable_thinking: bool, data_dir: Path = DATA_DIR):
        self.tasks = list(tasks)
        self.enable_thinking = enable_thinking
        self.data_dir = data_dir
        self._sets: dict[str, list[PromptSet]] = {}

    def prompt_sets(self, tokenizer_path: str) -> list[PromptSet]:
        if tokenizer_path not in self._sets:
            tokenizer = load_tokenizer(tokenizer_path)
            self._sets[tokenizer_path] = [PromptSet(t, tokenizer, self.enable_thinking, self.data_dir) for t in self.tasks]
        return self._sets[tokenizer_path]


def measure_server(document: dict, label: str, base_url: str, workload: Workload, args,
                   tokenizer: str | None = None, title: str | None = None, **server_fields) -> None:  # fmt: skip
    """Add one server's runs (or its failure) to `document`."""
    entry = {"base_url": base_url, "title": title or label, **server_fields, "error": None}
    document["servers"][label] = entry
    try:
        entry["model_info"] = server_info(base_url)
    except (OSError, http.client.HTTPException, RequestFailed, ValueError) as error:
        entry["error"] = f"GET {base_url}/model_info failed: {type(error).__name__}: {error}"
        print(f"-- {label}: {entry['error']}", file=sys.stderr)
        return
    tokenizer = tokenizer or entry["model_info"].get("tokenizer_path") or entry["model_info"].get("model_path")
    entry["tokenizer"] = tokenizer
    document["config"]["tokenizer"] = document["config"].get("tokenizer") or tokenizer
    document["runs"].extend(
        benchmark_server(label, base_url, workload.prompt_sets(tokenizer), args.concurrency, args.num_prompts,
                         sampling_from(args), args.timeout_s, progress=not args.no_progress,
                         warmup_max_new_tokens=args.warmup_max_new_tokens)  # fmt: skip
    )


def _parse_server(text: str) -> tuple[str, str]:
    label, sep, url = text.partition("=")
    if not sep:
        label, url = "server", text
    _split_url(url)
    return label, url.rstrip("/")


def run_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.serving", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--server", action="append", type=_parse_server, default=None, metavar="LABEL=URL",
                        help="a server to measure (repeatable; default dflash=http://127.0.0.1:30000). Label the "
                             "autoregressive one 'ar' to get speedups")  # fmt: skip
    parser.add_argument("--baseline", default=None, help="label the ratios divide by (default: 'ar' if present)")
    parser.add_argument("--ratio", action="append", type=parse_ratio, default=None, metavar="A/B",
                        help="ratios to tabulate (default: every server / the baseline)")  # fmt: skip
    parser.add_argument("--tokenizer", default=None, help="tokenizer path (default: the server's, from /model_info)")
    add_workload_arguments(parser)
    args = parser.parse_args(argv)
    servers = args.server or [("dflash", "http://127.0.0.1:30000")]
    labels = [label for label, _ in servers]
    if len(set(labels)) != len(labels):
        parser.error("server labels must be distinct")
    baseline = args.baseline or ("ar" if "ar" in labels else None)
    document = new_document(workload_config(args, args.tokenizer), baseline, args.ratio or default_ratios(labels, baseline))
    workload = Workload(args.tasks, args.enable_thinking)
    for label, url in servers:
        measure_server(document, label, url, workload, args, tokenizer=args.tokenizer,
                       title="AR" if label == baseline else None)  # fmt: skip
    return finish(document, args.out or default_out_dir())


def finish(document: dict, out_dir: Path) -> int:
    paths = write_report(document, out_dir)
    print()
    print(paths["markdown"].read_text())
    print(f"results: {paths['json']}\ntable:   {paths['markdown']}\nplot:    {paths['plot']}")
    return 0 if document_ok(document) else 1


def report_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.serving report",
                                     description="Merge results.json files into one table and plot.")  # fmt: skip
    parser.add_argument("results", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--baseline", default=None)
    parser.add_argument("--ratio", action="append", type=parse_ratio, default=None, metavar="A/B")
    args = parser.parse_args(argv)
    documents = [json.loads(path.read_text()) for path in args.results]
    return finish(merge_documents(documents, args.baseline, args.ratio or ()), args.out)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "report":
        return report_main(argv[1:])
    if argv and argv[0] == "run":
        argv = argv[1:]
    return run_main(argv)


if __name__ == "__main__":
    sys.exit(main())
