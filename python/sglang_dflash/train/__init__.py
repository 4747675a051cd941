"""The DFlash drafter training recipe: data from the target's own answers, then block-diffusion training."""
