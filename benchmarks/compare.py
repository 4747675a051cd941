"""`make bench`: the serving benchmark on the embedded default, three servers side by side.

On this machine's CPU, with SmolLM2-135M-Instruct as target and the shipped drafter (or --drafter
DIR), it starts in turn, each on a free port of 127.0.0.1 with the same flags:
  1. a plain autoregressive server                                   (AR)
  2. a DFLASH server with our worker                                 (DFLASH (ours))
  3. a DFLASH server with SGLang's builtin worker, SGLANG_DFLASH_IMPL=builtin  (DFLASH (builtin))
runs `benchmarks.serving` against each while it is up, and prints one table with all three and the
ratios ours/AR, builtin/AR and ours/builtin. A server that fails to start, or that turns out to be
served by the wrong worker, gets its column marked as failed with the error; it is never given a figure.

The default size (4 timed prompts per run but at least one per client, 24 new tokens, warm-up requests of
4 tokens, the five sets at concurrency 1, 8 and 32)
finished in 17 to 27 minutes on a quiet 2-core machine (2026-12-04, 2026-12-03); --full runs the whole sets with
2048 new tokens (hours on a CPU). The CPU is noisy: read the ratios, which compare servers measured
in the same run, rather than the absolute figures.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Sequence

from benchmarks import serving

SERVERS = {
    "ar": {"title": "AR", "impl": None},
    "ours": {"title": "DFLASH (ours)", "impl": "ours"},
    "builtin": {"title": "DFLASH (builtin)", "impl": "builtin"},
}
RATIOS = (("ours", "ar"), ("builtin", "ar"), ("ours", "builtin"))
OUR_WORKER_LINE = "DFLASH served by our worker"
BUILTIN_READY_LINE = "DFLASH draft runner ready"
ERROR_LINE = re.compile(r"(Error|Exception|error:|refused|must be|not supported)")


def dflash_args(drafter: Path, block_size: int) -> list[str]:
    return ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", str(drafter),
            "--speculative-num-draft-tokens", str(block_size)]  # fmt: skip


def short_error(message: str) -> str:
    """The most telling line of a start-up failure (the launcher's message carries the log tail)."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    telling = [line for line in lines if ERROR_LINE.search(line)]
    return (telling[-1] if telling else lines[0] if lines else "unknown error")[:400]


def worker_problem(label: str, log: str) -> str | None:
    """Why the server's log shows the wrong DFLASH worker, or None."""
    if label == "ours" and OUR_WORKER_LINE not in log:
        return f"the log lacks '{OUR_WORKER_LINE}': our worker did not serve DFLASH (plugin not loaded?)"
    if label == "builtin" and (OUR_WORKER_LINE in log or BUILTIN_READY_LINE not in log):
        return "the log does not show SGLang's builtin DFLASH draft runner"
    return None


def make_random_drafter(target: Path, out_dir: Path, block_size: int) -> Path:
    """A random drafter shaped for `target`, written by `python -m sglang_dflash.random_checkpoints drafter`."""
    subprocess.run([sys.executable, "-m", "sglang_dflash.random_checkpoints", "drafter", "--target", str(target),
                    "--out", str(out_dir), "--block-size", str(block_size)], check=True)  # fmt: skip
    return out_dir


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--drafter", type=Path, default=None,
                        help="drafter directory (default: the shipped SmolLM2 drafter, sglang_dflash/assets/smollm2-dflash)")
    parser.add_argument("--random-drafter", action="store_true",
                        help="use a freshly made random drafter instead (acceptance ~1: checks the harness, not speed)")
    parser.add_argument("--target", default=None, help="target model directory (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--block-size", type=int, default=16, help="--speculative-num-draft-tokens")
    parser.add_argument("--servers", default="ar,ours,builtin", help="which of ar,ours,builtin to run, in that order")
    parser.add_argument("--max-total-tokens", type=int, default=32768,
                        help="KV pool of every server (32 clients with long prompts need more than the default 8192)")
    parser.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                        help="an extra flag for every server (repeatable, e.g. --server-arg=--chunked-prefill-size=512)")
    parser.add_argument("--start-timeout-s", type=float, default=900.0)
    parser.add_argument("--full", action="store_true", help="the whole sets and 2048 new tokens (overrides the two sizes)")
    serving.add_workload_arguments(parser, num_prompts="4", max_new_tokens=24, timeout_s=1800.0, warmup_max_new_tokens=4)
    args = parser.parse_args(argv)
    if args.full:
        args.num_prompts, args.max_new_tokens = None, 2048
    labels = [s.strip() for s in args.servers.split(",") if s.strip()]
    if not labels or any(label not in SERVERS for label in labels):
        parser.error(f"--servers takes a subset of {','.join(SERVERS)}")

    from sglang_dflash.launch import ServerStartError, launch_server
    from sglang_dflash.targets import smollm2_hf_dir

    out_dir = args.out or serving.default_out_dir("cpu-")
    out_dir.mkdir(parents=True, exist_ok=True)
    target = Path(args.target) if args.target else smollm2_hf_dir()
    drafter = args.drafter
    if args.random_drafter:
        drafter = make_random_drafter(target, Path(tempfile.mkdtemp(prefix="bench-drafter-")), args.block_size)
    elif drafter is None and any(label != "ar" for label in labels):
        from sglang_dflash.assets import smollm2_drafter_dir

        try:
            drafter = smollm2_drafter_dir()
        except FileNotFoundError as missing:
            print(f"{missing}\npass --drafter DIR, or --random-drafter to check the harness with a random one")
            return 2

    common = ["--max-total-tokens", str(args.max_total_tokens), "--max-running-requests", str(max(args.concurrency)),
              *args.server_arg]  # fmt: skip
    document = serving.new_document(serving.workload_config(args, str(target)), "ar" if "ar" in labels else None,
                                    [r for r in RATIOS if r[0] in labels and r[1] in labels])  # fmt: skip
    document["setup"] = {"target": str(target), "drafter": str(drafter) if drafter else None,
                         "random_drafter": args.random_drafter, "block_size": args.block_size,
                         "server_flags": common}  # fmt: skip
    workload = serving.Workload(args.tasks, args.enable_thinking)
    print(f"-- target {target}\n-- drafter {drafter}{' (random)' if args.random_drafter else ''}\n-- results {out_dir}")

    for label in labels:
        spec = SERVERS[label]
        extra = common + (dflash_args(drafter, args.block_size) if spec["impl"] else [])
        env = {"SGLANG_DFLASH_IMPL": spec["impl"]} if spec["impl"] else {}
        fields = {"speculative": spec["impl"] is not None, "impl": spec["impl"], "server_args": extra, "env": env}
        print(f"-- {spec['title']}: starting the server (SGLang CPU engine)", flush=True)
        try:
            with launch_server(target, extra, env=env, timeout=args.start_timeout_s, log_dir=out_dir / "logs" / label) as server:
                print(f"   ready after {server.startup_s:.0f} s on {server.base_url}; log {server.log_path}", flush=True)
                problem = worker_problem(label, server.log_path.read_text(errors="replace"))
                if problem:
                    document["servers"][label] = {**fields, "title": spec["title"], "base_url": server.base_url,
                                                  "log": str(server.log_path), "error": problem}  # fmt: skip
                    print(f"   {problem}", flush=True)
                    continue
                serving.measure_server(document, label, server.base_url, workload, args, tokenizer=str(target),
                                       title=spec["title"], log=str(server.log_path), startup_s=server.startup_s,
                                       **fields)  # fmt: skip
                if server.process.poll() is not None:
                    document["servers"][label]["exit_code"] = server.process.returncode
        except ServerStartError as failure:
            error = short_error(str(failure))
            document["servers"][label] = {**fields, "title": spec["title"], "error": f"did not start: {error}",
                                          "error_detail": str(failure)}  # fmt: skip
            print(f"   did not start: {error}", flush=True)
    return serving.finish(document, out_dir)


if __name__ == "__main__":
    sys.exit(main())
