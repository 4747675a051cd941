"""sglang-dflash: DFlash block-diffusion speculative decoding for SGLang."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("sglang-dflash")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+source"
