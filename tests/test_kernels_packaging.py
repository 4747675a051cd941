"""The kernels ship as sglang_dflash.kernels with their sources, and the worker's choice of core."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import torch

import sglang_dflash.kernels as kernels
from sglang_dflash.sglang.draft_runner import DraftRunner, resolve_draft_attention_core

ROOT = Path(__file__).resolve().parents[1]


def test_pyproject_lists_every_package_and_maps_the_kernels():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = {
        ".".join(init.parent.relative_to(ROOT / "python").parts)
        for init in (ROOT / "python").rglob("__init__.py")
        if "__pycache__" not in init.parts and not any(part.endswith(".egg-info") for part in init.parts)
    }
    listed = set(setuptools["packages"])
    assert on_disk - listed == set(), f"packages missing from pyproject.toml's list: {sorted(on_disk - listed)}"
    assert setuptools["package-dir"]["sglang_dflash.kernels"] == "kernels"
    assert {"*.cu", "*.cpp"} <= set(setuptools["package-data"]["sglang_dflash.kernels"])


def test_installed_kernels_package_carries_its_cuda_sources():
    here = Path(kernels.__file__).resolve().parent
    for name in ("block_verify.cu", "block_verify_binding.cpp", "draft_attention.py"):
        assert (here / name).is_file(), f"{name} is not next to sglang_dflash.kernels ({here})"


@pytest.mark.parametrize("requested", ["triton", "fa4", "torch_native", None])
def test_every_backend_runs_the_twin_on_a_cpu(requested):
    assert resolve_draft_attention_core(requested, "cpu", torch.bfloat16) == "torch"


def test_unknown_core_is_refused():
    with pytest.raises(ValueError, match="draft attention core"):
        DraftRunner.__init__(object.__new__(DraftRunner), _TinyDrafter(), 8, "cpu", None, None, attention_core="fa5")


class _TinyDrafter(torch.nn.Module):
    """Just enough of DFlashDrafter for DraftRunner's constructor."""

    def __init__(self):
        super().__init__()
        from types import SimpleNamespace

        self.config = SimpleNamespace(num_key_value_heads=1, head_dim=4)
        self.fc = torch.nn.Linear(2, 2)
        self.layers = torch.nn.ModuleList([torch.nn.Identity()])


def test_gpu_check_script_runs_at_a_tiny_size_on_cpu(tmp_path):
    """benchmarks/gpu_check.py's own code path (twins only on a CPU); the GPU run is gpu_check.sh."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    out = tmp_path / "gpu_check.json"
    assert gpu_check.main(["--tiny", "--device", "cpu", "--repeats", "1", "--out", str(out)]) == 0
    results = json.loads(out.read_text())
    assert {"draft_attention", "drafter_pass", "block_verify"} <= set(results) and results["failures"] == []
