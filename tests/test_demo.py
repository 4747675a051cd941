"""`make demo` end to end, shortened: real DFLASH and plain SGLang servers, the OpenAI client, the report."""

from __future__ import annotations

import pytest

from sglang_dflash import demo
from sglang_dflash.launch import free_port


@pytest.mark.server
def test_demo_serves_the_shipped_drafter_and_matches_the_plain_server(capsys):
    code = demo.main(["--max-tokens", "48", "--repeats", "1", "--port", str(free_port())])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "answers identical: yes" in out
    dflash_row = next(line for line in out.splitlines() if line.startswith("DFLASH (sglang-dflash)"))
    accept = float(dflash_row.split()[-1])
    assert 1.0 <= accept <= 16.0
    assert "speed-up DFLASH / autoregressive:" in out
