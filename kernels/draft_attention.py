"""Draft attention: each request's B block queries over its paged context K/V plus the block's own K/V.

One launch serves the whole batch. Request b's context is the first `context_lens[b]` tokens of its
row in `req_to_token`, whose entries are slot ids into `key_pool` / `value_pool` (SGLang's paged
layout, page size 1). Block query i sits at position `context_lens[b] + i`; it sees every context
key and every block key (non-causal inside the block unless `causal`), and on sliding-window
layers only keys with |q_pos - k_pos| < window. Grouped-query attention: query head h reads KV
head h // (heads / kv_heads). Inputs bf16 or fp16; scores, softmax and sums in fp32.

`draft_attention_reference` is the plain-PyTorch twin (same signature) and the CPU path;
`draft_attention` picks the Triton kernel for CUDA tensors and the twin otherwise.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from sglang_dflash.drafter import draft_visibility, masked_attention


# ---------------------------------------------------------------------------------------- the twin
def draft_attention_reference(
    queries: torch.Tensor,  # [bs, B, heads, D], normed and rotated
    block_keys: torch.Tensor,  # [bs, B, kv_heads, D]
    block_values: torch.Tensor,  # [bs, B, kv_heads, D]
    key_pool: torch.Tensor,  # [slots, kv_heads, D]: one draft layer's context keys
    value_pool: torch.Tensor,  # [slots, kv_heads, D]
    req_to_token: torch.Tensor,  # [max_requests, max_len] slot ids
    req_pool_indices: torch.Tensor,  # [bs] row of each request in req_to_token
    context_lens: torch.Tensor,  # [bs] committed tokens = position of the first block token
    window: int | None = None,
    causal: bool = False,
    scale: float | None = None,
    max_context_len: int | None = None,
) -> torch.Tensor:
    """[bs, B, heads, D] in the queries' dtype. `max_context_len` is a hint the twin does not need."""
    lengths = context_lens.to(torch.int64)
    block_len = queries.shape[1]
    # Keys further back than the window are invisible to every block query: do not gather them.
    starts = torch.zeros_like(lengths) if window is None else (lengths - window + 1).clamp(min=0)
    width = int((lengths - starts).max()) if lengths.numel() else 0
    positions = starts[:, None] + torch.arange(width, device=lengths.device)[None, :]
    valid = positions < lengths[:, None]
    positions = torch.where(valid, positions, torch.zeros_like(positions))
    slots = req_to_token[req_pool_indices.to(torch.int64)[:, None], positions].to(torch.int64)
    slots = torch.where(valid, slots, torch.zeros_like(slots))
    keys = torch.cat([key_pool[slots], block_keys], dim=1)
    values = torch.cat([value_pool[slots], block_values], dim=1)
    block_positions = lengths[:, None] + torch.arange(block_len, device=lengths.device)[None, :]
    visible = draft_visibility(positions, valid, block_positions, window, causal)
    scale = queries.shape[-1] ** -0.5 if scale is None else scale
    return masked_attention(queries, keys, values, visible, scale)


# ------------------------------------------------------------------------------------ the kernel
@triton.jit
def _online_softmax_update(q, k, v, visible, m_i, l_i, acc, scale_log2, DOT_FP32: tl.constexpr):
    """Fold one tile of keys/values into the running max, sum and output (flash-attention style)."""
    p_dtype = v.dtype  # the probabilities meet V in V's precision
    if DOT_FP32:
        k, v = k.to(tl.float32), v.to(tl.float32)
    scores = tl.where(visible, tl.dot(q, tl.trans(k)) * scale_log2, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, axis=1))
    p = tl.exp2(scores - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    p_low = p.to(p_dtype)
    if DOT_FP32:
        p_low = p_low.to(tl.float32)
    return m_new, l_i, acc * alpha[:, None] + tl.dot(p_low, v)


@triton.jit
def _draft_attention_kernel(
    Q, BK, BV, KPool, VPool, ReqToToken, ReqIdx, CtxLens, Out, PartialOut, PartialLse,
    stride_qb, stride_qi, stride_qh,
    stride_bkb, stride_bki, stride_bkh,
    stride_bvb, stride_bvi, stride_bvh,
    stride_ks, stride_kh, stride_vs, stride_vh,
    stride_rt,
    stride_ob, stride_oi, stride_oh,
    stride_pb, stride_pi, stride_ph, stride_ps,
    scale_log2, window, keys_per_split,
    BLOCK_LEN: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_D: tl.constexpr,
    HAS_WINDOW: tl.constexpr, CAUSAL: tl.constexpr, SPLIT: tl.constexpr, DOT_FP32: tl.constexpr,
):
    """One program = one request, one KV head, one slice of its context keys.

    Its BLOCK_M rows are the B block queries x the GROUP query heads sharing this KV head, so each
    K/V tile is loaded once for the whole group. The last slice also takes the block's own keys.
    """
    batch = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    num_splits = tl.num_programs(2)

    ctx_len = tl.load(CtxLens + batch).to(tl.int32)
    req_row = tl.load(ReqIdx + batch).to(tl.int64)
    ctx_start = 0
    if HAS_WINDOW:
        ctx_start = tl.maximum(ctx_len - window + 1, 0)
    lo = ctx_start + split * keys_per_split
    hi = tl.minimum(lo + keys_per_split, ctx_len)

    rows = tl.arange(0, BLOCK_M)
    query_index = rows // GROUP
    head = kv_head * GROUP + rows % GROUP
    row_valid = query_index < BLOCK_LEN
    dims = tl.arange(0, BLOCK_D)
    dim_valid = dims < HEAD_DIM
    q_ptrs = Q + batch * stride_qb + query_index[:, None] * stride_qi + head[:, None] * stride_qh + dims[None, :]
    q = tl.load(q_ptrs, mask=row_valid[:, None] & dim_valid[None, :], other=0.0)
    if DOT_FP32:  # Triton's CPU interpreter gets bf16 tl.dot wrong; the GPU keeps bf16/fp16 MMA
        q = q.to(tl.float32)
    q_pos = ctx_len + query_index

    # Finite start so a slice without visible keys gives exp(-inf - m) = 0, never NaN.
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    cols = tl.arange(0, BLOCK_N)
    for start in range(lo, hi, BLOCK_N):
        k_pos = start + cols
        k_valid = k_pos < hi
        slots = tl.load(ReqToToken + req_row * stride_rt + k_pos, mask=k_valid, other=0).to(tl.int64)
        k = tl.load(KPool + slots[:, None] * stride_ks + kv_head * stride_kh + dims[None, :],
                    mask=k_valid[:, None] & dim_valid[None, :], other=0.0)
        v = tl.load(VPool + slots[:, None] * stride_vs + kv_head * stride_vh + dims[None, :],
                    mask=k_valid[:, None] & dim_valid[None, :], other=0.0)
        visible = k_valid[None, :]
        if HAS_WINDOW:
            visible = visible & ((q_pos[:, None] - k_pos[None, :]) < window)
        m_i, l_i, acc = _online_softmax_update(q, k, v, visible, m_i, l_i, acc, scale_log2, DOT_FP32)

    if split == num_splits - 1:
        block_cols = tl.arange(0, BLOCK_B)
        b_valid = block_cols < BLOCK_LEN
        k = tl.load(BK + batch * stride_bkb + block_cols[:, None] * stride_bki + kv_head * stride_bkh + dims[None, :],
                    mask=b_valid[:, None] & dim_valid[None, :], other=0.0)
        v = tl.load(BV + batch * stride_bvb + block_cols[:, None] * stride_bvi + kv_head * stride_bvh + dims[None, :],
                    mask=b_valid[:, None] & dim_valid[None, :], other=0.0)
        distance = query_index[:, None] - block_cols[None, :]
        visible = b_valid[None, :]
        if HAS_WINDOW:
            visible = visible & (tl.abs(distance) < window)
        if CAUSAL:
            visible = visible & (distance >= 0)
        m_i, l_i, acc = _online_softmax_update(q, k, v, visible, m_i, l_i, acc, scale_log2, DOT_FP32)

    store_mask = row_valid[:, None] & dim_valid[None, :]
    if SPLIT:
        # Normalised partial output and its log2-sum-exp; the combine kernel weighs the slices.
        safe_l = tl.where(l_i > 0, l_i, 1.0)
        p_ptrs = (PartialOut + batch * stride_pb + query_index[:, None] * stride_pi + head[:, None] * stride_ph
                  + split * stride_ps + dims[None, :])
        tl.store(p_ptrs, acc / safe_l[:, None], mask=store_mask)
        lse = tl.where(l_i > 0, m_i + tl.log2(safe_l), float("-inf"))
        lse_ptrs = PartialLse + ((batch * BLOCK_LEN + query_index) * (num_splits * GROUP * tl.num_programs(1))
                                 + head * num_splits + split)
        tl.store(lse_ptrs, lse, mask=row_valid)
    else:
        o_ptrs = Out + batch * stride_ob + query_index[:, None] * stride_oi + head[:, None] * stride_oh + dims[None, :]
        tl.store(o_ptrs, (acc / l_i[:, None]).to(Out.dtype.element_ty), mask=store_mask)


@triton.jit
def _combine_splits_kernel(
    PartialOut, PartialLse, Out,
    stride_pb, stride_pi, stride_ph, stride_ps,
    stride_ob, stride_oi, stride_oh,
    num_heads, num_splits,
    HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """One program per (request, query, head): the softmax-weighted sum of its slices."""
    row = tl.program_id(0)
    splits = tl.arange(0, BLOCK_S)
    s_valid = splits < num_splits
    lse = tl.load(PartialLse + row * num_splits + splits, mask=s_valid, other=float("-inf"))
    weights = tl.exp2(lse - tl.max(lse, axis=0))
    weights = weights / tl.sum(weights, axis=0)
    dims = tl.arange(0, BLOCK_D)
    d_valid = dims < HEAD_DIM
    # PartialOut is [bs, B, heads, splits, D]; `row` runs over (bs, B, heads) in that order.
    base = PartialOut + row * stride_ph
    partial = tl.load(base + splits[:, None] * stride_ps + dims[None, :],
                      mask=s_valid[:, None] & d_valid[None, :], other=0.0)
    out = tl.sum(partial * weights[:, None], axis=0)
    tl.store(Out + row * stride_oh + dims, out.to(Out.dtype.element_ty), mask=d_valid)


def _num_splits(batch: int, kv_heads: int, span: int, block_n: int, device) -> int:
    """Enough context slices to fill the GPU when the batch alone does not (long contexts, small batches)."""
    if span <= 4 * block_n:
        return 1
    units = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 132
    wanted = max(1, (2 * units) // max(1, batch * kv_heads))
    # A slice shorter than a few tiles costs more in combining than it gains.
    return max(1, min(wanted, span // (4 * block_n), 64))


def draft_attention_triton(
    queries, block_keys, block_values, key_pool, value_pool, req_to_token, req_pool_indices, context_lens,
    window=None, causal=False, scale=None, max_context_len=None, num_splits: int | None = None,
):
    """The Triton kernel; same signature and result as `draft_attention_reference` (plus `num_splits`)."""
    batch, block_len, num_heads, head_dim = queries.shape
    kv_heads = block_keys.shape[2]
    if num_heads % kv_heads:
        raise ValueError(f"{num_heads} query heads do not group over {kv_heads} KV heads")
    if queries.dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"draft attention kernel takes bf16 or fp16, got {queries.dtype}")
    for name, t in (("queries", queries), ("block_keys", block_keys), ("block_values", block_values),
                    ("key_pool", key_pool), ("value_pool", value_pool), ("req_to_token", req_to_token)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension")
    group = num_heads // kv_heads
    out = torch.empty_like(queries)
    if batch == 0:
        return out
    scale = head_dim**-0.5 if scale is None else scale
    if max_context_len is None:
        max_context_len = int(context_lens.max())  # one host sync; callers that know it pass it
    span = max_context_len if window is None else min(max_context_len, window - 1)

    block_d = triton.next_power_of_2(head_dim)
    block_m = max(16, triton.next_power_of_2(block_len * group))
    block_b = max(16, triton.next_power_of_2(block_len))
    # Big head dims and many query rows hold more registers per key: smaller key tiles.
    block_n = 64 if block_d <= 128 and block_m <= 64 else 32
    if num_splits is None:
        num_splits = _num_splits(batch, kv_heads, span, block_n, queries.device)
    keys_per_split = max(block_n, triton.cdiv(triton.cdiv(max(span, 1), num_splits), block_n) * block_n)
    num_splits = max(1, triton.cdiv(max(span, 1), keys_per_split))

    if num_splits > 1:
        partial_out = torch.empty(batch, block_len, num_heads, num_splits, head_dim,
                                  dtype=torch.float32, device=queries.device)
        partial_lse = torch.empty(batch, block_len, num_heads, num_splits, dtype=torch.float32, device=queries.device)
    else:
        partial_out = partial_lse = out  # unused
    _draft_attention_kernel[(batch, kv_heads, num_splits)](
        queries, block_keys, block_values, key_pool, value_pool, req_to_token, req_pool_indices, context_lens,
        out, partial_out, partial_lse,
        queries.stride(0), queries.stride(1), queries.stride(2),
        block_keys.stride(0), block_keys.stride(1), block_keys.stride(2),
        block_values.stride(0), block_values.stride(1), block_values.stride(2),
        key_pool.stride(0), key_pool.stride(1), value_pool.stride(0), value_pool.stride(1),
        req_to_token.stride(0),
        out.stride(0), out.stride(1), out.stride(2),
        partial_out.stride(0) if num_splits > 1 else 0, partial_out.stride(1) if num_splits > 1 else 0,
        partial_out.stride(2) if num_splits > 1 else 0, partial_out.stride(3) if num_splits > 1 else 0,
        scale * math.log2(math.e), window or 0, keys_per_split,
        BLOCK_LEN=block_len, GROUP=group, HEAD_DIM=head_dim,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_B=block_b, BLOCK_D=block_d,
        HAS_WINDOW=window is not None, CAUSAL=bool(causal), SPLIT=num_splits > 1,
        DOT_FP32=bool(triton.knobs.runtime.interpret),
        num_warps=8 if block_m * block_d >= 64 * 256 else 4, num_stages=2,
    )
    if num_splits > 1:
        out_rows = out.view(batch * block_len * num_heads, head_dim)
        _combine_splits_kernel[(batch * block_len * num_heads,)](
            partial_out, partial_lse, out_rows,
            0, 0, num_splits * head_dim, head_dim,
            0, 0, out_rows.stride(0),
            num_heads, num_splits,
            HEAD_DIM=head_dim, BLOCK_S=triton.next_power_of_2(num_splits), BLOCK_D=block_d,
        )
    return out


def draft_attention(*args, **kwargs):
    """The kernel for CUDA tensors, the twin elsewhere (same signature as the twin)."""
    queries = args[0] if args else kwargs["queries"]
    if queries.is_cuda:
        return draft_attention_triton(*args, **kwargs)
    return draft_attention_reference(*args, **kwargs)
