"""The pure-torch `sgl_kernel` stand-in: each op against a plain loop, plus the import rules.

The stand-in is loaded by path under a private module name, so no `sgl_kernel` ever lands in
sys.modules and other tests are unaffected.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

from sglang_dflash.sglang.cpu import export_line, standin_path


def _load_standin():
    path = os.path.join(standin_path(), "sgl_kernel", "__init__.py")
    spec = importlib.util.spec_from_file_location(
        "_sgl_kernel_standin_under_test", path, submodule_search_locations=[os.path.dirname(path)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a package must be registered to resolve its own submodules
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


sk = _load_standin()
POOL_ROWS, POOL_LEN = 8, 40


def _ragged_batch(generator, bs=4, max_len=9, max_start=20):
    """Distinct request rows, random [start, end) ranges (some empty) inside POOL_LEN."""
    rows = torch.randperm(POOL_ROWS, generator=generator)[:bs]
    starts = torch.randint(0, max_start, (bs,), generator=generator)
    lengths = torch.randint(0, max_len, (bs,), generator=generator)
    lengths[0] = max(int(lengths[0]), 1)
    return rows, starts, starts + lengths


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_assign_req_to_token_pool(seed, index_dtype):
    g = torch.Generator().manual_seed(seed)
    table = torch.randint(0, 1000, (POOL_ROWS, POOL_LEN), generator=g, dtype=torch.int32)
    rows, starts, ends = (t.to(index_dtype) for t in _ragged_batch(g))
    total = int((ends - starts).sum())
    out_cache_loc = torch.randint(0, 5000, (total + 3,), generator=g, dtype=torch.int64)  # longer than needed

    expected = table.clone()
    offset = 0
    for r, s, e in zip(rows.tolist(), starts.tolist(), ends.tolist()):
        expected[r, s:e] = out_cache_loc[offset : offset + e - s].to(torch.int32)
        offset += e - s

    sk.assign_req_to_token_pool_cpu(rows, table, starts, ends, out_cache_loc, POOL_LEN)
    assert torch.equal(table, expected)


@pytest.mark.parametrize("seed", range(5))
def test_assign_extend_cache_locs(seed):
    g = torch.Generator().manual_seed(seed)
    table = torch.randint(0, 1000, (POOL_ROWS, POOL_LEN), generator=g, dtype=torch.int32)
    rows, starts, ends = _ragged_batch(g)
    total = int((ends - starts).sum())
    out = torch.full((total + 2,), -7, dtype=torch.int64)

    expected = out.clone()
    offset = 0
    for r, s, e in zip(rows.tolist(), starts.tolist(), ends.tolist()):
        expected[offset : offset + e - s] = table[r, s:e]
        offset += e - s

    before = table.clone()
    sk.assign_extend_cache_locs_cpu(rows, table, starts, ends, out, POOL_LEN)
    assert torch.equal(out, expected)  # the tail past `total` is left alone
    assert torch.equal(table, before)


def test_assign_extend_cache_locs_is_the_inverse_of_assign_req_to_token_pool():
    g = torch.Generator().manual_seed(11)
    table = torch.zeros(POOL_ROWS, POOL_LEN, dtype=torch.int32)
    rows, starts, ends = _ragged_batch(g)
    total = int((ends - starts).sum())
    locs = torch.randperm(5000, generator=g)[:total]
    sk.assign_req_to_token_pool_cpu(rows, table, starts, ends, locs, POOL_LEN)
    back = torch.empty(total, dtype=torch.int64)
    sk.assign_extend_cache_locs_cpu(rows, table, starts, ends, back, POOL_LEN)
    assert torch.equal(back, locs)


@pytest.mark.parametrize("topk,num_cols", [(1, 1), (1, 5), (2, 3)])
def test_assign_draft_cache_locs_contiguous(topk, num_cols):
    g = torch.Generator().manual_seed(topk * 10 + num_cols)
    table = torch.randint(0, 1000, (POOL_ROWS, POOL_LEN), generator=g, dtype=torch.int32)
    bs, n = 3, topk * num_cols
    rows = torch.randperm(POOL_ROWS, generator=g)[:bs]
    seq_lens = torch.randint(0, POOL_LEN - n, (bs,), generator=g)
    out = torch.full((bs * n,), -1, dtype=torch.int64)

    expected = torch.cat([table[r, s : s + n] for r, s in zip(rows.tolist(), seq_lens.tolist())]).long()

    sk.assign_draft_cache_locs_contiguous_cpu(rows, table, seq_lens, out, POOL_LEN, topk, num_cols)
    assert torch.equal(out, expected)


def _kv_buffers(generator):
    """Two layer buffers of different dtypes and row widths, like a K and a V pool."""
    return [
        torch.randn(12, 3, 8, generator=generator),
        torch.randn(12, 2, 16, generator=generator).to(torch.bfloat16),
    ]


def _pointer_args(buffers):
    data_ptrs = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.uint64)
    strides = torch.tensor([b.stride(0) * b.element_size() for b in buffers])
    return data_ptrs, strides


@pytest.mark.parametrize(
    "src,tgt",
    [
        ([1, 4, 7], [9, 2, 11]),  # disjoint
        ([1, 2, 3], [2, 3, 4]),  # overlapping: every source must be read before any write
        ([5], [5]),  # self copy
        ([], []),
    ],
)
def test_copy_all_layer_kv_cache(src, tgt):
    g = torch.Generator().manual_seed(3)
    buffers = _kv_buffers(g)
    expected = [b.clone() for b in buffers]
    src_t, tgt_t = torch.tensor(src, dtype=torch.int64), torch.tensor(tgt, dtype=torch.int64)
    for e in expected:
        e[tgt_t] = e[src_t].clone()

    sk.copy_all_layer_kv_cache_cpu(*_pointer_args(buffers), tgt_t, src_t)
    for b, e in zip(buffers, expected):
        assert torch.equal(b, e)


def test_copy_all_layer_kv_cache_touches_no_other_row():
    g = torch.Generator().manual_seed(4)
    buffers = _kv_buffers(g)
    before = [b.clone() for b in buffers]
    sk.copy_all_layer_kv_cache_cpu(*_pointer_args(buffers), torch.tensor([0]), torch.tensor([3]))
    for b, o in zip(buffers, before):
        assert torch.equal(b[1:], o[1:])
        assert torch.equal(b[0], o[3])


def test_version_matches_the_installed_wheel():
    from importlib.metadata import PackageNotFoundError, version

    try:
        expected = version("sglang-kernel")
    except PackageNotFoundError:
        expected = "0.4.10"
    assert sk.__version__ == expected


def test_unknown_op_imports_but_raises_when_called():
    op = sk.some_cuda_only_op  # like `from sgl_kernel import some_cuda_only_op`
    assert callable(op)
    with pytest.raises(NotImplementedError, match="some_cuda_only_op"):
        op(torch.zeros(1))
    assert not hasattr(sk, "__wrapped__")  # dunder probes still see an ordinary module


def test_no_torch_custom_ops_registered():
    # SGLang reads torch.ops.sgl_kernel.convert_weight_packed as "AMX kernels present".
    assert not hasattr(torch.ops.sgl_kernel, "convert_weight_packed")


def test_module_entry_point_prints_one_export_line(tmp_path):
    code = "import sys, sglang_dflash.sglang.cpu; print(sorted({'torch', 'sglang'} & set(sys.modules)))"
    imported = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert imported.stdout.strip() == "[]"  # importing the helper pulls in neither torch nor sglang

    printed = subprocess.run(
        [sys.executable, "-m", "sglang_dflash.sglang.cpu"], capture_output=True, text=True, check=True
    ).stdout
    assert printed == export_line() + "\n"
    assert printed == f"export PYTHONPATH={standin_path()}${{PYTHONPATH:+:$PYTHONPATH}}\n"

    # The documented activation line, run by a real shell, makes `import sgl_kernel` find the stand-in.
    # Submodules stay missing: SGLang imports sgl_kernel.allreduce / .scalar_type under
    # `except ImportError` and falls back, which a stub module would defeat.
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import sgl_kernel\n"
        "print(sgl_kernel.__file__)\n"
        "try:\n"
        "    import sgl_kernel.allreduce\n"
        "except ImportError:\n"
        "    print('no allreduce')\n"
    )
    script = f'eval "$({sys.executable} -m sglang_dflash.sglang.cpu)"; {sys.executable} {probe}'
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    found = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True, env=env).stdout
    assert found.splitlines() == [os.path.join(standin_path(), "sgl_kernel", "__init__.py"), "no allreduce"]
