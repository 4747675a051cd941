"""`make serve` as a user runs it: a foreground DFLASH server an OpenAI client can use, stopped by Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from openai import OpenAI

from sglang_dflash.demo import spec_accept_length
from sglang_dflash.launch import HOST, Server, free_port, stop_process_group, wait_until_ready

pytestmark = pytest.mark.server


def test_serve_answers_openai_clients_with_dflash_and_stops_on_ctrl_c(tmp_path):
    port = free_port()
    log_path = tmp_path / "serve.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "sglang_dflash.serve", "--port", str(port)],
                                   stdout=log, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    server = Server(f"http://{HOST}:{port}", port, log_path, process)
    try:
        wait_until_ready(server, timeout=600)
        banner = log_path.read_text().splitlines()[0]
        assert banner.startswith(f"-- serving DFLASH on http://{HOST}:{port}/v1"), banner
        client = OpenAI(base_url=server.base_url + "/v1", api_key="none", timeout=600)
        reply = client.chat.completions.create(
            model="default", temperature=0, max_tokens=24,
            messages=[{"role": "user", "content": "Write a quicksort in Python."}],
            extra_body={"return_spec_tokens_details": True},
        )  # fmt: skip
        assert reply.choices[0].message.content and reply.usage.completion_tokens == 24
        accept = spec_accept_length(reply)  # None unless the server speculated
        assert accept is not None and 1.0 <= accept <= 16.0
        assert "DFLASH served by our worker" in log_path.read_text(errors="replace")

        os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C in the terminal sends to the foreground group
        assert process.wait(timeout=120) is not None
    finally:
        stop_process_group(process)
