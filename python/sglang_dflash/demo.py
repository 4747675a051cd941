"""`make demo`: DFlash served by SGLang on the CPU, SmolLM2-135M-Instruct with the shipped drafter.

1. starts a DFLASH server (our worker, the shipped drafter, block 16) on 127.0.0.1:30000;
2. sends the seed request through the OpenAI client (chat, temperature 0) and prints the answer;
3. stops it, starts a plain autoregressive server with the same flags, sends the same request;
4. prints tokens/s of both, the acceptance length, the speed-up and whether the answers are identical.
Each server answers the request once to warm up, then `--repeats` timed times (the median is shown).
"""

from __future__ import annotations

import argparse
import socket
import sys
import time
from dataclasses import dataclass

from .launch import HOST, launch_server

SEED_PROMPT = "Write a quicksort in Python."
DEMO_PORT = 30000


def dflash_server_args(drafter_dir, block_size: int = 16) -> list[str]:
    return [
        "--speculative-algorithm", "DFLASH",
        "--speculative-draft-model-path", str(drafter_dir),
        "--speculative-num-draft-tokens", str(block_size),
    ]  # fmt: skip


@dataclass
class Measurement:
    text: str
    completion_tokens: int
    seconds: float
    acceptance_length: float | None

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.seconds


def ask(base_url: str, prompt: str, max_tokens: int) -> Measurement:
    """One non-streaming chat completion at temperature 0 through the OpenAI client, timed end to end."""
    from openai import OpenAI

    client = OpenAI(base_url=base_url + "/v1", api_key="none", timeout=600)
    started = time.perf_counter()
    response = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": prompt}],
        temperature=0,
        max_tokens=max_tokens,
        extra_body={"return_spec_tokens_details": True},
    )
    seconds = time.perf_counter() - started
    return Measurement(response.choices[0].message.content, response.usage.completion_tokens, seconds,
                       spec_accept_length(response))


def spec_accept_length(response) -> float | None:
    """SGLang's per-request `spec_accept_length` (in the `sglext` extension of the choice), if speculating."""
    for holder in (response.choices[0], response):
        extension = (getattr(holder, "model_extra", None) or {}).get("sglext") or {}
        details = extension.get("spec_tokens_details")
        if isinstance(details, list):
            details = details[0] if details else None
        if details and details.get("spec_verify_ct"):
            return float(details["spec_accept_length"])
    return None


def measure(label: str, model_dir, extra_args, prompt: str, max_tokens: int, repeats: int, port: int) -> Measurement:
    print(f"-- starting the {label} server on {HOST}:{port} (SGLang CPU engine; about 30 s)", flush=True)
    with launch_server(model_dir, extra_args, port=port, timeout=600) as server:
        print(f"   ready after {server.startup_s:.0f} s; warm-up request, then {repeats} timed", flush=True)
        ask(server.base_url, prompt, max_tokens)
        runs = [ask(server.base_url, prompt, max_tokens) for _ in range(repeats)]
    runs.sort(key=lambda m: m.seconds)
    median = runs[len(runs) // 2]
    if len({m.text for m in runs}) != 1:
        print(f"   warning: the {label} server gave different answers to the same greedy request")
    return median


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        return sock.connect_ex((HOST, port)) != 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt", default=SEED_PROMPT)
    parser.add_argument("--max-tokens", type=int, default=384)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--port", type=int, default=DEMO_PORT)
    parser.add_argument("--drafter", default=None, help="drafter directory (default: the shipped SmolLM2 drafter)")
    parser.add_argument("--block-size", type=int, default=16)
    args = parser.parse_args(argv)

    from .assets import smollm2_drafter_dir
    from .targets import smollm2_hf_dir

    if not port_is_free(args.port):
        print(f"port {args.port} on {HOST} is already in use (a `make serve` still running?); stop it or pass --port")
        return 2
    target = smollm2_hf_dir()
    drafter = args.drafter or smollm2_drafter_dir()
    print(f"-- target {target}\n-- drafter {drafter}\n-- prompt {args.prompt!r} (chat template, temperature 0)")
    spec = measure("DFLASH", target, dflash_server_args(drafter, args.block_size), args.prompt, args.max_tokens,
                   args.repeats, args.port)
    print("\n" + spec.text.rstrip() + "\n", flush=True)
    plain = measure("autoregressive", target, [], args.prompt, args.max_tokens, args.repeats, args.port)

    rows = [("autoregressive", plain), ("DFLASH (sglang-dflash)", spec)]
    print(f"\n{'server':<24}{'tokens':>8}{'seconds':>10}{'tokens/s':>10}{'accept len':>12}")
    for name, m in rows:
        accept = f"{m.acceptance_length:.2f}" if m.acceptance_length else "-"
        print(f"{name:<24}{m.completion_tokens:>8}{m.seconds:>10.2f}{m.tokens_per_s:>10.1f}{accept:>12}")
    print(f"speed-up DFLASH / autoregressive: {spec.tokens_per_s / plain.tokens_per_s:.2f}x "
          f"(median of {args.repeats} timed requests each, same machine, same run)")
    identical = spec.text == plain.text
    print(f"answers identical: {'yes' if identical else 'NO'}")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
