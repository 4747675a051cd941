"""A pure-torch stand-in for the CUDA-only `sgl_kernel` wheel, for SGLang's CPU engine.

SGLang 0.5.23 on the CPU (`SGLANG_USE_CPU_ENGINE=1`) imports a few `*_cpu` ops from
`sgl_kernel` at module import; the PyPI wheel cannot be imported without an NVIDIA driver and
has no CPU ops anyway. This package provides the ops that plain and speculative serving call,
written with plain torch indexing, and lets every other name be imported: calling one raises
NotImplementedError naming it.

No `torch.ops.sgl_kernel.*` custom op is registered on purpose: SGLang treats
`torch.ops.sgl_kernel.convert_weight_packed` as "AMX kernels available" and would then pack
weights for kernels we do not have. Without them it uses its own torch fallbacks.

Put the parent directory first on PYTHONPATH (`eval "$(python -m sglang_dflash.sglang.cpu)"`).
"""

from __future__ import annotations

import ctypes
from importlib import metadata as _metadata

import torch

try:
    __version__ = _metadata.version("sglang-kernel")
except _metadata.PackageNotFoundError:
    __version__ = "0.4.10"


def _ragged_slots(
    rows: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, column) of every cell [starts[i], ends[i]) of row rows[i], requests in order."""
    starts = starts.to(torch.int64)
    lengths = ends.to(torch.int64) - starts
    total = int(lengths.sum())
    first = torch.cumsum(lengths, 0) - lengths  # where request i begins in the packed output
    rank = torch.arange(total, device=lengths.device) - first.repeat_interleave(lengths)
    return (
        rows.to(torch.int64).repeat_interleave(lengths),
        starts.repeat_interleave(lengths) + rank,
    )


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Write the KV slots of an extend into the request table, in place.

    For request i (in order): req_to_token[req_pool_indices[i], start_offset[i]:end_offset[i]]
    takes the next end_offset[i] - start_offset[i] entries of out_cache_loc.
    """
    table = req_to_token.view(-1, pool_len)
    rows, cols = _ragged_slots(req_pool_indices, start_offset, end_offset)
    table[rows, cols] = out_cache_loc[: rows.numel()].to(table.dtype)


def assign_extend_cache_locs_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """The reverse gather of `assign_req_to_token_pool_cpu`, writing out_cache_loc in place.

    The slots req_to_token[req_pool_indices[i], start_offset[i]:end_offset[i]] of every request
    are packed, request after request, into the front of out_cache_loc.
    """
    table = req_to_token.view(-1, pool_len)
    rows, cols = _ragged_slots(req_pool_indices, start_offset, end_offset)
    out_cache_loc[: rows.numel()] = table[rows, cols].to(out_cache_loc.dtype)


def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
    topk: int,
    num_cols: int,
) -> None:
    """Gather each request's topk * num_cols draft slots, starting at its seq len, in place.

    out_cache_loc[i * n:(i + 1) * n] = req_to_token[req_pool_indices[i], seq_lens[i]:seq_lens[i] + n]
    with n = topk * num_cols.
    """
    n = topk * num_cols
    assign_extend_cache_locs_cpu(req_pool_indices, req_to_token, seq_lens, seq_lens + n, out_cache_loc, pool_len)


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor,
    strides: torch.Tensor,
    tgt_loc: torch.Tensor,
    src_loc: torch.Tensor,
) -> None:
    """Copy KV rows src_loc[i] -> tgt_loc[i] in every layer buffer, in place.

    Buffer j starts at raw address data_ptrs[j] and its rows are strides[j] bytes apart (the row
    width is the stride: buffers are contiguous). All sources are read before any target is
    written, so overlapping source and target sets are safe.
    """
    if tgt_loc.numel() == 0:
        return
    tgt = tgt_loc.to(torch.int64)
    src = src_loc.to(torch.int64)
    num_rows = int(torch.maximum(tgt.max(), src.max())) + 1
    for address, row_bytes in zip(data_ptrs.tolist(), strides.tolist()):
        raw = (ctypes.c_uint8 * (num_rows * row_bytes)).from_address(address)
        rows = torch.frombuffer(raw, dtype=torch.uint8).view(num_rows, row_bytes)
        rows[tgt] = rows[src]


def _not_implemented(name: str):
    def op(*args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name} is not implemented by the pure-torch CPU stand-in (sglang_dflash.sglang.cpu)"
        )

    op.__name__ = op.__qualname__ = name
    return op


def __getattr__(name: str):
    """Any other op can be imported; calling it raises NotImplementedError naming it.

    There are no submodules: the ones SGLang's CPU path tries (`sgl_kernel.allreduce`,
    `sgl_kernel.scalar_type`) are imported under `except ImportError` with a CPU fallback, so
    they are left missing on purpose.
    """
    if name.startswith("__"):  # keep `hasattr(module, "__something__")` probes honest
        raise AttributeError(name)
    return _not_implemented(name)
