#!/usr/bin/env bash
# gemma-4-26B-A4B-it + z-lab/gemma-4-26B-A4B-it-DFlash shapes with random weights (no download):
# our DFLASH worker and SGLang's builtin (SGLANG_DFLASH_IMPL=builtin), acceptance fixed by
# SGLANG_SIMULATE_ACC_LEN, concurrency 1, 8 and 32; tokens/s, and per step draft, verify,
# accept+commit and scheduler overhead for ours (step time only for the builtin).
#   SIZE=full|tiny  full: the real shapes, built and served on the GPU (bf16, about 53 GB on disk);
#                   tiny: the scaled-down test pair on the CPU (float32; what the test runs)
#   OUT=dir         weights, logs, results.json (default /tmp/sglang-dflash-gemma4-synthetic)
#   ACC_LEN=4       SGLANG_SIMULATE_ACC_LEN (mean committed tokens per step, 1..16)
#   CONCURRENCY="1 8 32"  PROMPT_LEN=256  MAX_NEW_TOKENS=256  IMPLS="ours builtin"
#   PYTHON=..       the interpreter (default .venv/bin/python, else python)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
[ -x "$PYTHON" ] || PYTHON=python
SIZE=${SIZE:-full}
OUT=${OUT:-/tmp/sglang-dflash-gemma4-synthetic}
ACC_LEN=${ACC_LEN:-4}
CONCURRENCY=${CONCURRENCY:-1 8 32}
PROMPT_LEN=${PROMPT_LEN:-256}
MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-256}
IMPLS=${IMPLS:-ours builtin}
mkdir -p "$OUT"
DEVICE_FLAG=()
if [ "$SIZE" = full ]; then
    DEVICE_FLAG=(--gpu)
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
fi
# shellcheck disable=SC2086  # the lists are meant to split into arguments
"$PYTHON" benchmarks/gemma4_synthetic.py --size "$SIZE" --out "$OUT" "${DEVICE_FLAG[@]}" \
    --acc-len "$ACC_LEN" --concurrency $CONCURRENCY --impls $IMPLS \
    --prompt-len "$PROMPT_LEN" --max-new-tokens "$MAX_NEW_TOKENS" 2>&1 | tee "$OUT/run.log"
