"""`make demo`: DFlash on the embedded default, SmolLM2-135M-Instruct on the CPU.

For now this runs the reference decoder with a randomly initialised drafter (so the acceptance
length is about 1: every step still emits the target's own token, and the output is exactly the
target's). It prints the answer, the acceptance statistics and the target-only comparison.
"""

from __future__ import annotations

import sys

from .generate import main as generate_main
from .random_checkpoints import main as make_checkpoint
from .targets import cache_dir

SEED_PROMPT = "Write a quicksort in Python."


def main() -> int:
    drafter_dir = cache_dir() / "random-drafter-smollm2"
    if not (drafter_dir / "config.json").exists():
        print(f"-- writing a random SmolLM2 drafter to {drafter_dir}")
        make_checkpoint(["drafter", "--target", "smollm2", "--out", str(drafter_dir)])
    print(f"-- prompt: {SEED_PROMPT!r} (chat template, temperature 0)")
    return generate_main(
        ["--target", "smollm2", "--drafter", str(drafter_dir), "--prompt", SEED_PROMPT, "--chat",
         "--max-new-tokens", "96", "--temperature", "0", "--compare-ar"]
    )


if __name__ == "__main__":
    sys.exit(main())
