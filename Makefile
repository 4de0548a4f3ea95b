# autofit: `make demo` and `make test` create the environment when it is missing.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# CPU-only machines get torch's CPU build (an unpinned torch pulls several GB of CUDA packages).
TORCH_CPU ?= torch==2.13.0
DEMO_OUT ?= autofit-out/demo
# PPO was removed in TRL 1.13: its tests run with this TRL overlaid on the environment.
TRL_PPO ?= trl==1.12.0
PPO_OVERLAY ?= .trl112

.PHONY: venv demo test test-main test-ppo test-fast gpu-test clean bench

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	if $(BIN)/python -c "import torch" 2>/dev/null; then :; \
	elif nvidia-smi -L >/dev/null 2>&1; then $(BIN)/python -m pip install -q torch; \
	else $(BIN)/python -m pip install -q $(TORCH_CPU); fi
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@

demo: venv
	$(BIN)/autofit search --model tiny-qwen2 --device cpu --gpu-memory 300MiB --max-length 128 --out $(DEMO_OUT)

test: test-main test-ppo

test-main: venv
	$(BIN)/python -m pytest -q

$(PPO_OVERLAY)/.installed: $(VENV)/.installed
	$(BIN)/python -m pip install -q --no-deps --upgrade --target $(PPO_OVERLAY) $(TRL_PPO)
	touch $@

test-ppo: venv $(PPO_OVERLAY)/.installed
	PYTHONPATH=$(PPO_OVERLAY) $(BIN)/python -m pytest -q -m ppo

test-fast: venv
	$(BIN)/python -m pytest -q -m "not slow"

gpu-test: venv
	$(BIN)/python -m pytest -q -m gpu

# autofit against auto_find_batch_size, doubling/bisection, decay and an exhaustive grid (benchmarks/README.md);
# not part of `make test`. Writes docs/benchmarks.md; probes and results.json go to /tmp/autofit-bench-<time>/.
bench: venv
	BENCH_COMMAND="make bench" $(BIN)/python -m benchmarks.run $(BENCH_ARGS)

clean:
	rm -rf autofit-out .pytest_cache $(PPO_OVERLAY)
