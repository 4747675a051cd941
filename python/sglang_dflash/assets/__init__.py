"""Checkpoints shipped inside the package (no model hub needed)."""

from __future__ import annotations

from pathlib import Path

SMOLLM2_DRAFTER = "smollm2-dflash"


def smollm2_drafter_dir() -> Path:
    """The trained DFlash drafter for SmolLM2-135M-Instruct (z-lab format, block 16)."""
    path = Path(__file__).parent / SMOLLM2_DRAFTER
    if not (path / "config.json").exists() or not (path / "model.safetensors").exists():
        raise FileNotFoundError(f"the shipped SmolLM2 drafter is missing from {path}; reinstall sglang-dflash")
    return path
