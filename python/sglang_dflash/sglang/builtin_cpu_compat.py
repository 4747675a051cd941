"""Compatibility patches that let SGLang's *builtin* DFLASH worker run on a CPU.

Loaded by the plugin only when SGLANG_DFLASH_IMPL=builtin and SGLANG_USE_CPU_ENGINE=1, so the
two workers can be compared on the same machine. Our own worker needs none of this (it builds
no SGLang draft runner and never calls these code paths). Each patch answers one failure of
SGLang 0.5.23's builtin DFLASH on a CPU; none changes results on a GPU because none is loaded there.
The CUDA gate and TARGET_VERIFY on torch_native are handled for both workers elsewhere
(`plugin._handle_dflash`, `cpu/verify_attention.py`).
"""

from __future__ import annotations

import torch


def register(registry, hook_type) -> None:
    # The draft runner's backend must be torch_native; 0.5.23 silently maps it to flashinfer.
    from sglang.srt.arg_groups.choices import DRAFT_ATTENTION_BACKEND_CHOICES

    if "torch_native" not in DRAFT_ATTENTION_BACKEND_CHOICES:
        DRAFT_ATTENTION_BACKEND_CHOICES.append("torch_native")
    registry.register("torch.Tensor.record_stream", _record_stream_skipping_cpu, hook_type.AROUND)
    registry.register("sglang.srt.models.dflash.DFlashAttention.__init__", _no_triton_qk_norm_rope, hook_type.AFTER)
    registry.register(
        "sglang.srt.model_executor.model_runner.ModelRunner._extend_forward_kwargs",
        _input_embeds_in_model_dtype,
        hook_type.AFTER,
    )


def _record_stream_skipping_cpu(original, tensor, stream):
    """The builtin records `batch.seq_lens` on the device stream; a CPU tensor has none."""
    if tensor.device.type == "cpu":
        return None
    return original(tensor, stream)


def _no_triton_qk_norm_rope(_result, attention, *args, **kwargs):
    """The bf16 fused q/k-norm + RoPE path is a Triton kernel with no device check."""
    attention.use_table_qk_norm_rope = False


def _input_embeds_in_model_dtype(kwargs, runner, *args, **_kwargs):
    """0.5.23 casts DFLASH input embeddings to bf16 whatever the model dtype; use the model's."""
    embeds = kwargs.get("input_embeds")
    if embeds is not None and embeds.dtype != runner.dtype:
        kwargs["input_embeds"] = embeds.to(runner.dtype)
    return kwargs
