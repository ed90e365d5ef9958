# Two commands on a fresh machine: `make run` and `make test`. Each sets up .venv on first use.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
STUDY  ?= gpt_training
CONFIRM ?= 2
ARGS   ?=

.PHONY: run test test-fast bench gpu-check dashboard lint clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip setuptools wheel
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/autoscout run $(STUDY) --confirm $(CONFIRM) $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q -ra

test-fast: $(STAMP)
	$(PY) -m pytest -q -ra -m "not slow"

bench: $(STAMP)
	$(PY) -m autoscout_optuna.benchmark $(ARGS)
	$(if $(strip $(ARGS)),,$(PY) -m autoscout_optuna.benchmark.confirmation)

gpu-check:
	bash scripts/gpu_check.sh

dashboard: $(STAMP)
	$(VENV)/bin/autoscout dashboard

lint: $(STAMP)
	$(VENV)/bin/ruff check autoscout_optuna studies tests

clean:
	rm -rf $(VENV) build *.egg-info
