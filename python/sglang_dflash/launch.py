"""Real SGLang servers on 127.0.0.1 (tests, `make demo`, benchmarks): `with launch_server(model) as server: ...`.

The server runs SGLang 0.5.23's CPU engine with our pure-torch `sgl_kernel` stand-in first on
PYTHONPATH (with `gpu=True`: SGLang's own defaults on the GPU), in its own process group, logging
stdout and stderr to a file. It is ready when GET /health_generate answers 200 (that endpoint runs
a real one-token generation). On exit the whole process group is stopped: SIGTERM, then SIGKILL
for whatever is left after 20 s.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping, Sequence

from sglang_dflash.sglang.cpu import standin_path

HOST = "127.0.0.1"
STOP_GRACE_S = 20.0
LOG_TAIL_LINES = 60

# Flags that make SGLang 0.5.23 run (quietly, reproducibly) on a CPU-only x86 machine.
CPU_SERVER_ARGS = (
    "--device", "cpu",
    "--cuda-graph-backend-decode", "disabled",
    "--cuda-graph-backend-prefill", "disabled",
    "--sleep-on-idle",  # otherwise the idle scheduler busy-polls a core
    "--max-total-tokens", "8192",
    "--dtype", "float32",
    "--random-seed", "0",
    "--skip-server-warmup",
)  # fmt: skip


# SGLang refuses `--attention-backend torch_native` for Gemma-4 (an assertion in
# arg_groups/model_hook.py); without the flag its CPU default (intel_amx) falls back to
# torch_native on a machine without SGLang's AMX ops, so the same backend serves either way.
NO_ATTENTION_FLAG_MODEL_TYPES = ("gemma4", "gemma4_text")


class ServerStartError(RuntimeError):
    pass


@dataclass
class Server:
    base_url: str
    port: int
    log_path: Path
    process: subprocess.Popen
    startup_s: float = 0.0  # launch until /health_generate first answered 200

    def post(self, path: str, payload: Mapping, timeout: float = 300.0) -> dict:
        """POST a JSON body, return the decoded JSON answer (raises on a non-2xx status)."""
        request = urllib.request.Request(
            self.base_url + path,
            data=json.dumps(payload).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())

    def get(self, path: str, timeout: float = 60.0) -> tuple[int, bytes]:
        """(status, body) of a GET; non-2xx statuses are returned, not raised."""
        try:
            with urllib.request.urlopen(self.base_url + path, timeout=timeout) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return log_tail(self.log_path, lines)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(deque(f, maxlen=lines))
    except FileNotFoundError:
        return "(no log)"


def server_env(env: Mapping[str, str] | None = None, gpu: bool = False) -> dict[str, str]:
    """os.environ, updated with `env`, plus (CPU) the CPU engine switch and the stand-in first on PYTHONPATH."""
    merged = {**os.environ, **(env or {})}
    if gpu:
        return merged
    merged["SGLANG_USE_CPU_ENGINE"] = "1"
    rest = merged.get("PYTHONPATH", "")
    merged["PYTHONPATH"] = standin_path() + (os.pathsep + rest if rest else "")
    return merged


def attention_args(model_path: str | os.PathLike) -> list[str]:
    """`--attention-backend torch_native`, except for targets SGLang accepts only without it (Gemma-4)."""
    config = Path(model_path) / "config.json"
    model_type = json.loads(config.read_text()).get("model_type") if config.is_file() else None
    return [] if model_type in NO_ATTENTION_FLAG_MODEL_TYPES else ["--attention-backend", "torch_native"]


def server_command(
    model_path: str | os.PathLike, port: int, extra_args: Sequence[str] = (), gpu: bool = False
) -> list[str]:
    device_args = [] if gpu else [*CPU_SERVER_ARGS, *attention_args(model_path)]
    return [
        sys.executable, "-m", "sglang.launch_server",
        "--model-path", str(model_path),
        *device_args,
        "--host", HOST,
        "--port", str(port),
        *map(str, extra_args),
    ]  # fmt: skip


def stop_process_group(process: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM the process group led by `process`, SIGKILL it if the leader outlives `grace_s`.

    Once the leader is gone, stragglers of the group (SGLang's scheduler and detokenizer
    normally exit with it) are killed too.
    """
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def wait_until_ready(server: Server, timeout: float) -> None:
    started = time.monotonic()
    while True:
        if server.process.poll() is not None:
            raise ServerStartError(
                f"SGLang server exited with code {server.process.returncode} while starting; "
                f"last {LOG_TAIL_LINES} lines of {server.log_path}:\n{server.log_tail()}"
            )
        left = timeout - (time.monotonic() - started)
        if left <= 0:
            raise ServerStartError(
                f"SGLang server not ready after {timeout:.0f} s; "
                f"last {LOG_TAIL_LINES} lines of {server.log_path}:\n{server.log_tail()}"
            )
        try:
            status, _ = server.get("/health_generate", timeout=max(1.0, min(left, 60.0)))
        except (OSError, http.client.HTTPException):  # URLError and timeouts are OSErrors
            status = None  # not listening yet
        if status == 200:
            return
        time.sleep(1.0)


@contextlib.contextmanager
def launch_server(
    model_path: str | os.PathLike,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    port: int | None = None,
    timeout: float = 240,
    log_dir: str | os.PathLike | None = None,
    gpu: bool = False,
) -> Iterator[Server]:
    """Start `python -m sglang.launch_server` on 127.0.0.1 for CPU and yield a ready `Server`.

    `extra_args` are appended to the CPU flags (argparse: a later flag wins). `env` is merged
    over os.environ. The log is kept after exit (in `log_dir`, or a fresh temporary directory)
    so a failure can point at it.
    """
    port = port or free_port()
    log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="sglang-server-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"server-{port}.log"
    command = server_command(model_path, port, extra_args, gpu=gpu)
    with open(log_path, "ab") as log:
        log.write(("$ " + " ".join(command) + "\n").encode())
        log.flush()
        launched = time.monotonic()
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=server_env(env, gpu=gpu),
            start_new_session=True,  # its own process group, so the whole tree can be stopped
        )
    server = Server(base_url=f"http://{HOST}:{port}", port=port, log_path=log_path, process=process)
    try:
        wait_until_ready(server, timeout)
        server.startup_s = time.monotonic() - launched
        yield server
    finally:
        stop_process_group(process)
