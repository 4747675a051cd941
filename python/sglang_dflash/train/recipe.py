"""The drafter shape and training hyper-parameters we use for a target (SmolLM2-135M by default)."""

from __future__ import annotations

import torch

from ..config import FULL_ATTENTION, DFlashConfig

BLOCK_SIZE = 16
NUM_DRAFT_LAYERS = 3
# Five target layers spread from the second to the fourth-last (the published drafters' choice for five ids).
NUM_TARGET_FEATURES = 5


def target_layer_ids(num_target_layers: int, count: int = NUM_TARGET_FEATURES) -> list[int]:
    start, end = 1, num_target_layers - 3
    return sorted({round(start + i * (end - start) / (count - 1)) for i in range(count)})


def drafter_config_for(target, num_layers: int = NUM_DRAFT_LAYERS, block_size: int = BLOCK_SIZE,
                       mask_token_id: int = 16) -> DFlashConfig:
    """A drafter as wide as the target, with the target's attention geometry and MLP width.

    The mask token is one the chat data never contains (SmolLM2's `<empty_output>`); its frozen
    target embedding is what the drafter learns to read as "to be predicted".
    """
    hf = target.model.config
    hf = getattr(hf, "text_config", None) or hf
    num_heads = int(hf.num_attention_heads)
    config = DFlashConfig(
        hidden_size=target.hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=int(getattr(hf, "num_key_value_heads", num_heads)),
        head_dim=int(getattr(hf, "head_dim", None) or target.hidden_size // num_heads),
        intermediate_size=int(hf.intermediate_size),
        rms_norm_eps=float(hf.rms_norm_eps),
        num_target_layers=target.num_layers,
        target_layer_ids=target_layer_ids(target.num_layers),
        block_size=block_size,
        mask_token_id=mask_token_id,
        layer_types=[FULL_ATTENTION] * num_layers,
        rope_theta=float((getattr(hf, "rope_parameters", None) or {}).get("rope_theta", 10000.0)),
        max_position_embeddings=int(hf.max_position_embeddings),
        vocab_size=target.vocab_size,
    )
    return DFlashConfig.from_dict(config.to_dict())


def native_bfloat16(device: str | torch.device) -> bool:
    """Whether bf16 arithmetic is fast on `device`: any GPU, or a CPU with AVX512-BF16 or AMX.

    Elsewhere (AVX2-only CPUs, e.g. AMD Zen 3) torch emulates bf16 and a bf16 matmul is about four
    times slower than a float32 one, so training and data generation run in float32 there.
    """
    device = torch.device(device)
    if device.type != "cpu":
        return True
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, probe, lambda: False)() for probe in probes)


def training_dtype(device: str | torch.device) -> torch.dtype:
    return torch.bfloat16 if native_bfloat16(device) else torch.float32
