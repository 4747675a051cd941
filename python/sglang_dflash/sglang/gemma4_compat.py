"""Two SGLang 0.5.23 fixes that a text-only Gemma-4 target needs (reference notes, section 6).

1. Config loading of `gemma4_text` checkpoints (any device). SGLang's Gemma-4 config fix-up
   (`_apply_gemma4_attention_overrides` in `srt/utils/hf_transformers/config.py`) only runs for
   the multimodal model types and reads `config.text_config`; a text-only checkpoint, whose
   sliding and full layers have different head dims / KV heads (`per_layer_config`), dies in
   the parser's generic attribute copy with AmbiguousGlobalPerLayerAttributeError. We run
   SGLang's own fix-up on the text config itself, right where the parser asks for the text
   config, before that copy. The multimodal google/gemma-4-26B-A4B-it is not affected.
2. `Gemma4RMSNorm` on the CPU (any target with a Gemma-4 MoE). Its `forward_native` /
   `forward_cpu` ignore the weight when `with_scale=False`, while the CUDA path always applies
   it. The MoE router folds its learned scale into exactly that weight, so on a CPU the experts
   are routed wrongly and the output differs from the first token. We apply the weight as the
   CUDA path does. Registered on the CPU engine only.

`SGLANG_DFLASH_GEMMA4_COMPAT=0` turns both off (to show what they fix).
"""

from __future__ import annotations

import os
from types import SimpleNamespace

SWITCH_VARIABLE = "SGLANG_DFLASH_GEMMA4_COMPAT"
TEXT_ONLY_MODEL_TYPE = "gemma4_text"
CONFIG_TARGET = "sglang.srt.utils.hf_transformers.config.get_hf_text_config"
NORM_TARGETS = (
    "sglang.srt.layers.layernorm.Gemma4RMSNorm.forward_native",
    "sglang.srt.layers.layernorm.Gemma4RMSNorm.forward_cpu",
)


def enabled() -> bool:
    return os.environ.get(SWITCH_VARIABLE, "1").strip().lower() not in ("0", "false", "no")


def register(registry, hook_type, on_cpu: bool) -> None:
    registry.register(CONFIG_TARGET, text_config_with_gemma4_fixup, hook_type.AROUND)
    if on_cpu:
        for target in NORM_TARGETS:
            registry.register(target, gemma4_norm_applying_weight, hook_type.AROUND)


def text_config_with_gemma4_fixup(original, config, *args, **kwargs):
    """SGLang's text-config lookup, after flattening a text-only Gemma-4 config (once)."""
    if needs_text_only_fixup(config):
        from sglang.srt.utils.hf_transformers.config import _apply_gemma4_attention_overrides

        # The fix-up reads `.text_config`; a text-only config is its own text config.
        _apply_gemma4_attention_overrides(SimpleNamespace(text_config=config))
    return original(config, *args, **kwargs)


def needs_text_only_fixup(config) -> bool:
    # `swa_num_key_value_heads` is what the fix-up writes: its presence means it already ran.
    return (
        getattr(config, "model_type", None) == TEXT_ONLY_MODEL_TYPE
        and "swa_num_key_value_heads" not in vars(config)
    )


def gemma4_norm_applying_weight(original, norm, x):
    """RMSNorm that multiplies by the weight also when `with_scale=False` (as forward_cuda does)."""
    if norm.with_scale:
        return original(norm, x)
    return (norm._norm(x.float()) * norm.weight.float()).type_as(x)
