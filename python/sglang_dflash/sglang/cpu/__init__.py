"""Running SGLang 0.5.23 on a CPU-only machine.

The PyPI `sglang-kernel` wheel is CUDA-only and cannot even be imported without an NVIDIA
driver, yet SGLang's CPU engine imports its `*_cpu` ops at module import. The directory
returned by `standin_path()` holds a small pure-torch package named `sgl_kernel` that
replaces it; put that directory first on PYTHONPATH for CPU runs only:

    eval "$(python -m sglang_dflash.sglang.cpu)"

This module imports neither sglang nor torch.
"""

from __future__ import annotations

import os
import shlex


def standin_path() -> str:
    """The directory to prepend to PYTHONPATH so that `import sgl_kernel` finds the stand-in."""
    return os.path.dirname(os.path.abspath(__file__))


def export_line() -> str:
    """One shell line that prepends `standin_path()` to PYTHONPATH."""
    return f"export PYTHONPATH={shlex.quote(standin_path())}${{PYTHONPATH:+:$PYTHONPATH}}"
