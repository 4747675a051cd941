"""Shared fixtures: tiny random checkpoints written in the real formats, made once per session."""

from __future__ import annotations

import signal
import sys

import pytest
import torch

from sglang_dflash.random_checkpoints import make_random_drafter, make_random_target
from sglang_dflash.targets import TargetModel

torch.set_num_threads(2)

# A terminated test run still leaves through its fixtures, so no server outlives it.
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    """checkpoints.target(family, **overrides) / checkpoints.drafter(name, **kwargs) -> directory (cached)."""
    root = tmp_path_factory.mktemp("checkpoints")
    made: dict[str, object] = {}

    class Factory:
        @staticmethod
        def target(family: str, seed: int = 0, **overrides):
            key = f"target-{family}-{seed}-{sorted(overrides.items())}"
            if key not in made:
                made[key] = make_random_target(family, root / f"t{len(made)}", seed=seed, **overrides)
            return made[key]

        @staticmethod
        def drafter(**kwargs):
            key = f"drafter-{sorted((k, str(v)) for k, v in kwargs.items())}"
            if key not in made:
                made[key] = make_random_drafter(root / f"d{len(made)}", **kwargs)
            return made[key]

    return Factory()


@pytest.fixture(scope="session")
def smollm2():
    """The real SmolLM2-135M-Instruct target in float32 (converted once from the packaged GGUF)."""
    return TargetModel.from_pretrained("smollm2", dtype=torch.float32)
