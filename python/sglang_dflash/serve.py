"""`make serve`: the DFLASH server of `make demo`, left running in the foreground on port 30000.

SmolLM2-135M-Instruct with the shipped drafter on the CPU engine; any further arguments are passed
to `sglang.launch_server` (a later flag wins), e.g. `--port 31000` or `--host 0.0.0.0`.
Stop it with Ctrl-C.
"""

from __future__ import annotations

import os
import sys

from .demo import DEMO_PORT, dflash_server_args
from .launch import HOST, server_command, server_env


def main(argv: list[str] | None = None) -> int:
    from .assets import smollm2_drafter_dir
    from .targets import smollm2_hf_dir

    extra = list(sys.argv[1:] if argv is None else argv)
    command = server_command(smollm2_hf_dir(), DEMO_PORT, dflash_server_args(smollm2_drafter_dir()) + extra)
    print(f"-- serving DFLASH on http://{HOST}:{DEMO_PORT}/v1 (OpenAI API); Ctrl-C stops it\n$ {' '.join(command)}",
          flush=True)
    os.execve(command[0], command, server_env())


if __name__ == "__main__":
    sys.exit(main())
