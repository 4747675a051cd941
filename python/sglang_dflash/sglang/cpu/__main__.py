"""`eval "$(python -m sglang_dflash.sglang.cpu)"` puts the pure-torch `sgl_kernel` first on PYTHONPATH."""

from . import export_line

print(export_line())
