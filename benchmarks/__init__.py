"""Serving benchmarks for sglang-dflash: `python -m benchmarks.serving` (any SGLang server) and
`python -m benchmarks.compare` (`make bench`: plain, our DFLASH and SGLang's builtin DFLASH on the CPU)."""
