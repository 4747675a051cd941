#!/usr/bin/env bash
# The kernels on one GPU, in under 8 minutes: build the CUDA verifier, run the kernel tests (their
# GPU-only cases included), then benchmarks/gpu_check.py (every kernel against its twin, timed
# against the twin and SGLang's own path at the gemma-4-26B-A4B drafter's shapes, batch 1/8/32,
# context 1k/8k/32k, block 16). Exit status is non-zero on any mismatch.
#   OUT=dir   where gpu_check.json and the logs go (default /tmp/sglang-dflash-gpu-check)
#   PYTHON=.. the interpreter (default .venv/bin/python, else python)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
[ -x "$PYTHON" ] || PYTHON=python
OUT=${OUT:-/tmp/sglang-dflash-gpu-check}
mkdir -p "$OUT"
# torch guesses CUDA_HOME from nvcc's location; a toolkit in /usr/local/cuda is the usual truth.
if [ -z "${CUDA_HOME:-}" ] && [ -x /usr/local/cuda/bin/nvcc ]; then export CUDA_HOME=/usr/local/cuda; fi

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"

echo "== build the CUDA block verifier (cached by torch after the first time)"
timeout 200 "$PYTHON" -c "import importlib; print(importlib.import_module('sglang_dflash.kernels.block_verify').load_extension().__file__)" \
    2>&1 | tee "$OUT/build.log"

echo "== kernel tests, GPU cases included"
timeout 120 "$PYTHON" -m pytest -q -rs tests/test_kernels_draft_attention.py tests/test_kernels_block_verify.py \
    tests/test_kernels_packaging.py 2>&1 | tee "$OUT/tests.log"

echo "== kernels vs twins vs SGLang, timed"
timeout 240 "$PYTHON" benchmarks/gpu_check.py --out "$OUT/gpu_check.json" 2>&1 | tee "$OUT/gpu_check.log"
