"""`make serve`: the DFLASH server of `make demo`, left running in the foreground on port 30000.

SmolLM2-135M-Instruct with the shipped drafter on the CPU engine; any further arguments are passed
to `sglang.launch_server` (a later flag wins), e.g. `--port 31000` or `--host 0.0.0.0`.
Stop it with Ctrl-C.
"""

from __future__ import annotations

import os
import sys

from .demo import DEMO_PORT, dflash_server_args
from .launch import server_command, server_env


def last_value(command: list[str], flag: str) -> str:
    values = [command[i + 1] for i, arg in enumerate(command[:-1]) if arg == flag]
    values += [arg.split("=", 1)[1] for arg in command if arg.startswith(flag + "=")]
    return values[-1]


def main(argv: list[str] | None = None) -> int:
    from .assets import smollm2_drafter_dir
    from .targets import smollm2_hf_dir

    extra = list(sys.argv[1:] if argv is None else argv)
    command = server_command(smollm2_hf_dir(), DEMO_PORT, dflash_server_args(smollm2_drafter_dir()) + extra)
    host, port = last_value(command, "--host"), last_value(command, "--port")  # argparse: the last one wins
    print(f"-- serving DFLASH on http://{host}:{port}/v1 (OpenAI API); Ctrl-C stops it\n$ {' '.join(command)}",
          flush=True)
    os.execve(command[0], command, server_env())


if __name__ == "__main__":
    sys.exit(main())
