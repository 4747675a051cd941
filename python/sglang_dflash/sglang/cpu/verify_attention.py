"""TARGET_VERIFY for SGLang's torch_native attention backend (CPU).

torch_native only knows prefill-style extends, which read `extend_prefix_lens`,
`extend_seq_lens` and a `seq_lens` that includes the new tokens. A verify batch carries none of
that: `seq_lens` holds the committed prefix and every request adds the same number of block
tokens. During a verify call we present the batch as exactly that extend, then restore it.
"""

from __future__ import annotations

TARGET = "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend.forward_extend"


def register(registry, hook_type) -> None:
    registry.register(TARGET, forward_extend_with_verify, hook_type.AROUND)


def forward_extend_with_verify(original, backend, q, k, v, layer, forward_batch, *args, **kwargs):
    if not forward_batch.forward_mode.is_target_verify() or forward_batch.extend_prefix_lens is not None:
        return original(backend, q, k, v, layer, forward_batch, *args, **kwargs)
    prefix = forward_batch.seq_lens
    block = q.shape[0] // prefix.shape[0]
    saved = (forward_batch.seq_lens, forward_batch.extend_prefix_lens, forward_batch.extend_seq_lens)
    forward_batch.seq_lens = prefix + block
    forward_batch.extend_prefix_lens = prefix
    forward_batch.extend_seq_lens = prefix.new_full(prefix.shape, block)
    try:
        return original(backend, q, k, v, layer, forward_batch, *args, **kwargs)
    finally:
        forward_batch.seq_lens, forward_batch.extend_prefix_lens, forward_batch.extend_seq_lens = saved
